"""How often a draft head guesses the target's next-but-one token, trained on the model's own answers.

    python benchmarks/draft_head_probe.py EXPORT TEST_STREAMS [--answers 160] [--mlp-epochs N] [--out DIR]

EXPORT: an edgespec ONNX directory (the default model's: `~/.cache/edgespec/onnx/...`). TEST_STREAMS: recorded
target-only Spec-Bench outputs of the same model (`edgespec replay --record`). The training text is the model's
own greedy answers to prompts written from the templates and topics below (nothing from Spec-Bench), recorded
here into DIR/draft_head_probe-answers.jsonl (a second run reuses them).

The head: at the last verified position t the engine has the target's last hidden state h_t and the token the
target chose next, x_{t+1}; the head maps [h_t / |h_t|, embedding(x_{t+1}), 1] linearly onto h_{t+1} / |h_{t+1}|
(least squares, ridge), and the target's own output projection turns that into a guess for x_{t+2}. It would cost
one small product per draft token. Scored on the test streams' generated positions where x_{t+1} is the greedy
token (what drafting sees): top-1 agreement with the target's choice, for growing shares of the training text.
benchmarks/draft_ceiling.py says what agreement a drafter needs (the 1.5× mark on the AVX-512 EPYC: ~0.4 at no
cost on the start-up calibration's curve, ~0.5 on the decode loop's).

``--mlp-epochs N`` (needs torch: the export-hf extra) also trains a nonlinear head on all the training text, with
cross-entropy against the target's choices through the target's own output projection (its rows limited to the
tokens the training answers choose, as a draft head's would be): [h_t, embedding(x_{t+1})] → a linear map to the
hidden width, plus one residual MLP block (LayerNorm, SiLU, MLP_HIDDEN wide) → the direction of h_{t+1}.
Prints a table, writes draft_head_probe.json and .png.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
from pathlib import Path

import numpy as np
from edgespec.export.onnx_reference import OnnxReference

from edgespec.bench.plots import line_chart
from edgespec.bench.replay import Stream, load_streams, record
from edgespec.tuning import cpu_identity

TOPICS = ("the water cycle", "photosynthesis", "the French Revolution", "machine learning", "climate change",
          "the stock market", "healthy sleep habits", "the history of the bicycle", "black holes", "the Roman Empire",
          "electric cars", "volcanoes", "the human immune system", "coffee", "the internet", "renewable energy",
          "the Great Wall of China", "honey bees", "chess openings", "the printing press", "vaccines", "earthquakes",
          "jazz music", "the Moon landing", "recycling", "inflation", "the Olympic Games", "meditation", "DNA",
          "rainforests", "public transportation", "the Renaissance", "social media", "ocean tides", "gardening",
          "artificial satellites", "the piano", "democracy", "dinosaurs", "time management")
TEMPLATES = ("Explain {t} in simple terms.", "Write a short essay about {t}.",
             "What are three interesting facts about {t}?", "Give me a list of pros and cons of {t}.",
             "Write a short poem about {t}.", "How would you teach a child about {t}?",
             "Summarize the main ideas of {t} in one paragraph.", "Write a friendly email to a colleague about {t}.",
             "What is the difference between {t} and {u}?", "Write a story for kids that involves {t}.",
             "List five questions a student might ask about {t}, with answers.", "Why is {t} important?")
SHARES = (0.125, 0.25, 0.5, 1.0)
RIDGE = 1e-4  # × training positions, on the normal equations' diagonal
MLP_HIDDEN = 1536  # the target's own MLP width


def own_answers(export: Path, count: int, path: Path, max_tokens: int = 256) -> list[Stream]:
    """The target's greedy answers to ``count`` prompts from the templates (``replay.record``: resumes a file)."""
    rnd = random.Random(7)
    pairs = [(template, topic) for template in TEMPLATES for topic in TOPICS]
    rnd.shuffle(pairs)
    questions = [{"question_id": i, "category": "own",
                  "turns": [template.format(t=topic, u=rnd.choice([t for t in TOPICS if t != topic]))]}
                 for i, (template, topic) in enumerate(pairs[:count])]
    record(str(export), questions, max_tokens, path, log=lambda _: None)
    return load_streams(path)


class Probe:
    """The export's last hidden states and greedy choices over whole sequences (prefill)."""

    def __init__(self, export: Path) -> None:
        self.ref = OnnxReference(export, threads=2)
        width = self.ref.manifest["hidden_size"]
        # The head graph is RMSNorm then the output projection: a one-hot row c·e_i comes out as
        # √width · g_i · W[:, i], so argmax over (x @ rows) is the head's argmax for any hidden x.
        self.rows = self.ref.head.run(None, {"hidden": np.eye(width, dtype=np.float32)[None] * 1000.0})[0][0]
        self.embedding = self.rows / np.linalg.norm(self.rows, axis=0).mean()  # tied: a token's row, rescaled

    def hidden(self, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Each position's last hidden state (unit length) and the target's choice there."""
        self.ref.truncate(0)
        hidden = self.ref.hidden(ids)
        choices = self.ref.head.run(None, {"hidden": hidden})[0][0].argmax(-1)
        return hidden[0] / np.linalg.norm(hidden[0], axis=1, keepdims=True), choices

    def pairs(self, streams: list[Stream], generated_only: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Features [h_t, embedding(x_{t+1}), 1], targets h_{t+1}, and the target's choice at t+1, for the
        positions where x_{t+1} is the target's own choice at t."""
        features, targets, labels = [], [], []
        for s in streams:
            ids = [*s.prompt, *s.output]
            h, choice = self.hidden(ids)
            t = np.arange(len(s.prompt) - 1 if generated_only else 0, len(ids) - 2)
            t = t[np.asarray(ids)[t + 1] == choice[t]]
            features.append(np.concatenate([h[t], self.embedding[:, choice[t]].T, np.ones((len(t), 1), np.float32)],
                                           1))
            targets.append(h[t + 1])
            labels.append(choice[t + 1])
        return np.concatenate(features), np.concatenate(targets), np.concatenate(labels)


def mlp_head(x: np.ndarray, labels: np.ndarray, test_x: np.ndarray, test_labels: np.ndarray, rows: np.ndarray,
             epochs: int) -> dict[str, float]:
    """An MLP head trained on (x, labels), x as ``Probe.pairs`` gives it: its top-1 agreement on the test positions,
    and the share of those whose token its output rows hold at all (its ceiling)."""
    import torch

    torch.manual_seed(0)
    width = rows.shape[0]
    vocab = np.unique(labels)  # the tokens the training answers choose: a draft head's output rows
    index = np.full(rows.shape[1], -1)
    index[vocab] = np.arange(len(vocab))
    out = torch.tensor(rows[:, vocab])
    inputs, targets = torch.tensor(x[:, :2 * width]), torch.tensor(index[labels])
    first = torch.nn.Linear(2 * width, width)
    block = torch.nn.Sequential(torch.nn.LayerNorm(width), torch.nn.Linear(width, MLP_HIDDEN), torch.nn.SiLU(),
                                torch.nn.Dropout(0.3), torch.nn.Linear(MLP_HIDDEN, width))

    def logits(features: torch.Tensor) -> torch.Tensor:
        z = first(features)
        return torch.nn.functional.normalize(z + block(z), dim=-1) @ out  # the target's head on h_{t+1}'s direction

    params = [*first.parameters(), *block.parameters()]
    batch = 256
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=epochs * (len(targets) // batch))
    agree = 0.0
    for epoch in range(epochs):
        block.train()
        order = torch.randperm(len(targets))
        for i in range(0, len(targets) - batch + 1, batch):
            pick = order[i:i + batch]
            loss = torch.nn.functional.cross_entropy(logits(inputs[pick]), targets[pick])
            opt.zero_grad()
            loss.backward()
            opt.step()
            schedule.step()
        block.eval()
        with torch.no_grad():
            guesses = vocab[logits(torch.tensor(test_x[:, :2 * width])).argmax(-1).numpy()]
        agree = float(np.mean(guesses == test_labels))
        print(f"  MLP head, epoch {epoch + 1}/{epochs}: top-1 {agree:.3f}")
    return {"top1": agree, "test_tokens_in_its_rows": float(np.mean(np.isin(test_labels, vocab)))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("export", type=Path)
    parser.add_argument("test_streams")
    parser.add_argument("--answers", type=int, default=160, help="own answers to generate for training")
    parser.add_argument("--mlp-epochs", type=int, default=0, help="also train an MLP head (needs torch)")
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    if args.mlp_epochs < 0:
        parser.error("--mlp-epochs must be 0 or more")
    if args.mlp_epochs and importlib.util.find_spec("torch") is None:
        parser.error("--mlp-epochs needs torch: pip install 'edgespec[export-hf]'")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    train = own_answers(args.export, args.answers, out / "draft_head_probe-answers.jsonl")
    probe = Probe(args.export)
    x, y, labels = probe.pairs(train, generated_only=False)
    test_x, _, test_labels = probe.pairs(load_streams(args.test_streams), generated_only=True)
    order = np.random.default_rng(0).permutation(len(x))
    rows = []
    for share in SHARES:
        pick = order[:int(len(order) * share)]
        a, b = x[pick], y[pick]
        head = np.linalg.solve(a.T @ a + RIDGE * len(a) * np.eye(a.shape[1]), a.T @ b)
        agree = float(np.mean(((test_x @ head) @ probe.rows).argmax(1) == test_labels))
        rows.append({"training_positions": len(pick), "top1": agree})
        print(f"{len(pick):>8} training positions: top-1 {agree:.3f} on {len(test_labels)} test positions")
    mlp = None
    if args.mlp_epochs > 0:
        mlp = {"training_positions": len(x), "epochs": args.mlp_epochs,
               **mlp_head(x, labels, test_x, test_labels, probe.rows, args.mlp_epochs)}
        print(f"{len(x):>8} training positions: MLP head top-1 {mlp['top1']:.3f} (its output rows hold "
              f"{mlp['test_tokens_in_its_rows']:.3f} of the test positions' tokens)")
    (out / "draft_head_probe.json").write_text(json.dumps(
        {"cpu": cpu_identity(), "export": str(args.export), "test_streams": args.test_streams,
         "answers": args.answers, "training_tokens": int(sum(len(s.output) for s in train)),
         "test_positions": len(test_labels), "rows": rows, "mlp": mlp}, indent=1))
    line_chart(out / "draft_head_probe.png", [r["training_positions"] for r in rows],
               [("linear head, top-1", [r["top1"] for r in rows], "tab:blue", "-")],
               "training positions (the model's own answers)", "top-1 agreement on Spec-Bench answers",
               "A linear draft head on the last hidden state")
    print(f"wrote {out / 'draft_head_probe.json'}, draft_head_probe.png")


if __name__ == "__main__":
    main()
