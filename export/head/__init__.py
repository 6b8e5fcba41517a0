"""The trained draft head (EAGLE): training it on the target's own answers, and exporting it to ONNX."""
