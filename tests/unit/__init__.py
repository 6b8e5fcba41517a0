"""Tests on the fake backend and of pure logic: no model is loaded, the whole folder runs in seconds (`make
test-unit`)."""
