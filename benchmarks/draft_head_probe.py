"""Historical: a one-off probe, kept to reproduce a past finding.
Kept for: the evidence that a head trained on the model's own answers guesses well enough to pay. The head
now ships, and `edgespec export head-weights` trains one.
How often a draft head guesses the target's next-but-one token, trained on the model's own answers.

    python benchmarks/draft_head_probe.py EXPORT TEST_STREAMS [--answers 160] [--mlp-epochs N] [--eagle-epochs N]
                                          [--eagle-weights HEAD.npz [--eagle-rows N]] [--out DIR]

EXPORT: an edgespec ONNX directory (the default model's: `~/.cache/edgespec/onnx/...`). TEST_STREAMS: recorded
target-only Spec-Bench outputs of the same model (`edgespec replay --record`). The training text is the model's
own greedy answers to prompts written from the templates and topics of ``export/head/training.py`` (nothing from
Spec-Bench), recorded
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
hidden width, plus one residual MLP block (LayerNorm, SiLU, as wide as the target's MLP) → the direction of h_{t+1}.

``--eagle-epochs N`` trains EAGLE's head (one decoder layer that attends over the earlier positions' features:
`head_training.eagle_module`, the runtime's draft head) on the same text here and scores it after every epoch, also
where n-gram lookup has no match and beside lookup itself; ``--eagle-weights`` scores a head trained elsewhere on
more text than 2 cores make (`edgespec export head-weights` on a GPU: docs/draft-head.md) on this export's features
and the test streams (unseen prompts), and replays it as a drafter (``chain_replay``).
Prints a table, writes draft_head_probe.json and .png.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
from pathlib import Path

import numpy as np
from edgespec.export.head.training import MLP_HIDDEN, TEMPLATES, TOPICS, Answer, eagle_module, load_weights, train_eagle
from edgespec.export.onnx.reference import OnnxReference

from edgespec.bench.plots import line_chart
from edgespec.bench.replay import Stream, load_streams, record
from edgespec.drafters.ngram import NgramDrafter
from edgespec.engine.sampling import SamplingParams
from edgespec.identity import cpu_identity

SHARES = (0.125, 0.25, 0.5, 1.0)
RIDGE = 1e-4  # × training positions, on the normal equations' diagonal
HEAD_COSTS = (0.02, 0.05, 0.1)  # a head token's time in target passes, for the replay's predicted speed-ups
CONFIDENCE = (0.1, 0.2, 0.4)  # the replay's gates on the head's own probability of a draft path


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

    def sequence(self, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Each position's last hidden state as the head takes it (before the final norm) and the target's choice."""
        self.ref.truncate(0)
        hidden = self.ref.hidden(ids)
        return hidden[0], self.ref.head.run(None, {"hidden": hidden})[0][0].argmax(-1)

    def token_embeddings(self) -> np.ndarray:
        """The target's input embedding table [vocab, width]."""
        vocab = self.rows.shape[1]
        return self.ref.embed.run(None, {"input_ids": np.arange(vocab, dtype=np.int64)[None]})[0][0]

    def hidden(self, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Each position's last hidden state (unit length) and the target's choice there."""
        hidden, choices = self.sequence(ids)
        return hidden / np.linalg.norm(hidden, axis=1, keepdims=True), choices

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


def lookup_guesses(ids: list[int], prompt: int) -> tuple[np.ndarray, np.ndarray]:
    """Per position j of ``ids`` from the prompt's end on: n-gram lookup's match length (0: none) and its guess for
    ids[j] (-1: none) from ids[:j], as mode ngram drafts it."""
    lookup, params, rng = NgramDrafter(), SamplingParams(), np.random.default_rng(0)
    keys, guesses = np.zeros(len(ids), int), np.full(len(ids), -1)
    context = list(ids[:prompt])
    lookup.begin(context)
    for j in range(prompt, len(ids)):
        draft = lookup.propose(context, 1, params, rng)
        if len(draft):
            keys[j], guesses[j] = draft.key[0], draft.tokens[0]
        context.append(ids[j])
    return keys, guesses


def score_eagle(head: object, test: list[Answer]) -> dict[str, float]:
    """Scored like the other heads (the next-but-one token where x_{t+1} is the greedy token, on the generated
    positions), overall and where n-gram lookup has no match there, beside lookup's own top-1 and either right;
    and a second step as drafting runs it (its own f̂_{t+1} and its own guess fed back: top-1 for x_{t+3} where the
    first guess was right, on a quarter of those positions)."""
    import torch

    head.eval()
    device = head.embed.device
    right1 = right2 = tried2 = total = unmatched = right_unmatched = lookup_right = either = 0
    with torch.no_grad():
        for f, ids, choice, prompt in test:
            keys, lookup_guess = lookup_guesses(ids.tolist(), prompt)
            n = len(ids)
            f, tokens, choice = (torch.tensor(a, device=device) for a in (f, ids, choice))
            pred = head(f[None, :n - 1], tokens[None, 1:])[0]
            guess = head.vocab[head.logits(pred).argmax(-1)]
            t = torch.arange(prompt - 1, n - 2, device=device)
            t = t[tokens[t + 1] == choice[t]]
            ok = guess[t] == choice[t + 1]
            at = (t + 2).cpu().numpy()
            by_lookup = torch.tensor(lookup_guess[at], device=device) == choice[t + 1]
            none = torch.tensor(keys[at] == 0, device=device)
            right1, total = right1 + int(ok.sum()), total + len(t)
            unmatched, right_unmatched = unmatched + int(none.sum()), right_unmatched + int(ok[none].sum())
            lookup_right, either = lookup_right + int(by_lookup.sum()), either + int((ok | by_lookup).sum())
            for i in t[ok][::4].tolist():
                out = head(torch.cat([f[:i + 1], pred[i:i + 1]])[None],
                           torch.cat([tokens[1:i + 2], guess[i:i + 1]])[None])
                tried2 += 1
                right2 += int(i + 2 < n and bool(tokens[i + 2] == choice[i + 1])
                              and bool(head.vocab[head.logits(out[0, -1]).argmax()] == choice[i + 2]))
    head.train()
    return {"top1": right1 / max(total, 1), "top1_no_lookup_match": right_unmatched / max(unmatched, 1),
            "no_lookup_match_share": unmatched / max(total, 1), "lookup_top1": lookup_right / max(total, 1),
            "either_top1": either / max(total, 1), "step2_top1": right2 / max(tried2, 1), "positions": total}


def _second(head: object, f: object, pred: object, tokens: object, first: object, j: int,
            cache: dict[int, tuple[int, float]]) -> tuple[int, float]:
    """The head's guess for x_{j+1} after its own f̂_{j-1} and guess for x_j, and its probability (cached)."""
    import torch

    if j not in cache:
        out = head(torch.cat([f[:j - 1], pred[j - 2:j - 1]])[None], torch.cat([tokens[1:j], first[j - 2:j - 1]])[None])
        p2 = torch.softmax(head.logits(out[0, -1]), -1).max(-1)
        cache[j] = int(head.vocab[p2.indices]), float(p2.values)
    return cache[j]


def chain_replay(head: object, test: list[Answer], gamma: int = 3) -> dict[str, dict]:
    """What the head would do as a drafter, replayed on the test streams (greedy: a draft token is accepted while
    it equals the recorded token): n-gram lookup's chain (up to ``gamma`` tokens) against lookup where it matched
    ≥ 2 tokens, else the head's chain of 1 or 2 (its first guess from the target's last computed feature and the
    token the target chose, the second from the head's own f̂ and guess), always or while the path's probability by
    the head's own softmax is at least a gate (EAGLE-2's confidence). τ = tokens a verify pass keeps; the
    speed-up over plain decoding (1 token a pass at cost 1) is predicted from the decode loop's curve on the
    AVX-512 EPYC (``replay.CURVES['avx512-prefetch-loop']``, rows = draft + 1) with each head token costing
    ``HEAD_COSTS`` passes (this head: 4.6 M parameters + 13 k output rows ≈ 9% of the target's bytes)."""
    import torch

    from edgespec.bench.replay import CURVES

    curve = CURVES["avx512-prefetch-loop"]
    # (head chain length, the path probability a head token needs by the head's own softmax; 0: always drafted)
    runs = {"lookup": (0, 0.0), "lookup, else head x1": (1, 0.0), "lookup, else head x2": (2, 0.0),
            **{f"lookup, else head while p >= {p}": (2, p) for p in CONFIDENCE}}
    totals = {name: [0, 0, 0.0, 0] for name in runs}  # tokens kept, passes, rows' cost, head tokens
    params, rng = SamplingParams(), np.random.default_rng(0)
    head.eval()
    with torch.no_grad():
        for f, ids, _, prompt in test:
            f, tokens = torch.tensor(f), torch.tensor(ids)
            pred = head(f[None, :len(ids) - 1], tokens[None, 1:])[0]
            top = torch.softmax(head.logits(pred), -1).max(-1)
            first, sure = head.vocab[top.indices], top.values  # first[i]: the guess for x_{i+2}, its probability
            seconds: dict[int, tuple[int, float]] = {}  # j → the head's second guess (x_{j+1}), its probability
            for name, (length, min_p) in runs.items():
                total, lookup, j = totals[name], NgramDrafter(), prompt
                context = list(ids[:prompt])
                lookup.begin(context)
                while j < len(ids):
                    draft = lookup.propose(context, gamma, params, rng)
                    guess = list(draft.tokens)
                    if length and (not len(draft) or draft.key[0] < 2) and j >= 2 and sure[j - 2] >= min_p:
                        guess = [int(first[j - 2])]
                        if length == 2 and j + 1 < len(ids):
                            if min_p == 0:  # behind a wrong first token the second row is verified all the same
                                guess.append(_second(head, f, pred, tokens, first, j, seconds)[0]
                                             if guess[0] == ids[j] else -1)
                            elif (later := _second(head, f, pred, tokens, first, j, seconds))[1] * float(
                                    sure[j - 2]) >= min_p:
                                guess.append(later[0])
                        total[3] += len(guess)
                    accepted = 0
                    while accepted < len(guess) and j + accepted < len(ids) and guess[accepted] == ids[j + accepted]:
                        accepted += 1
                    kept = min(accepted + 1, len(ids) - j)
                    total[0], total[1] = total[0] + kept, total[1] + 1
                    total[2] += curve[min(len(guess) + 1, max(curve))]
                    context.extend(int(t) for t in ids[j:j + kept])
                    j += kept
    head.train()
    return {name: {"tau": t / p, "head_tokens_per_pass": h / p,
                   **{f"predicted_speedup_head_cost_{c}": t / (rows + c * h) for c in HEAD_COSTS}}
            for name, (t, p, rows, h) in totals.items()}


def onnx_sequences(probe: Probe, streams: list[Stream], scale: float | None = None) -> tuple[list[Answer], float]:
    """The export's features for each stream, divided by ``scale`` (default: their RMS over all positions)."""
    raw = []
    for s in streams:
        ids = [*s.prompt, *s.output]
        f, choice = probe.sequence(ids)
        raw.append((f, np.asarray(ids), choice, len(s.prompt)))
    if scale is None:
        scale = float(np.sqrt(np.mean(np.concatenate([f for f, *_ in raw]) ** 2)))
    return [(f / scale, ids, choice, prompt) for f, ids, choice, prompt in raw], scale


def eagle_probe(probe: Probe, train: list[Stream], test: list[Stream], epochs: int,
                weights: Path | None, rows: int = 0) -> dict[str, object]:
    """Train the head here on the own answers (or load one trained elsewhere, ``--eagle-weights``: its features'
    scale and output rows come with it, cut to the ``rows`` tokens the own answers use most if given) and score it
    on the test streams after every epoch."""
    import torch

    torch.set_num_threads(2)
    width, heads = probe.rows.shape[0], probe.ref.manifest["num_attention_heads"]
    if weights is not None:
        state, vocab, scale, figures = load_weights(weights, rows)  # rows: the tokens its answers chose most
        head = eagle_module(width, heads, probe.token_embeddings(), probe.rows, vocab)
        loaded = head.load_state_dict({k: torch.tensor(v) for k, v in state.items()}, strict=False)
        if set(loaded.missing_keys) - {"embed", "out_rows", "vocab"} or loaded.unexpected_keys:
            raise SystemExit(f"{weights}: not a head of this shape ({loaded})")
        test_seqs, _ = onnx_sequences(probe, test, scale)
        scores = score_eagle(head, test_seqs)
        print(f"  EAGLE head from {weights}: {scores}")
        replay = chain_replay(head, test_seqs)
        print(f"  replayed as a drafter (chains, greedy): {replay}")
        return {**figures, "output_rows": len(vocab), **scores, "replay": replay}
    train_seqs, scale = onnx_sequences(probe, train)
    test_seqs, _ = onnx_sequences(probe, test, scale)
    vocab = np.unique(np.concatenate([c for *_, c, _ in train_seqs]))
    head = eagle_module(width, heads, probe.token_embeddings(), probe.rows, vocab)
    history: list[dict[str, float]] = []

    def report(epoch: int) -> None:
        history.append({"epoch": epoch + 1, **score_eagle(head, test_seqs)})
        print(f"  EAGLE head, epoch {epoch + 1}/{epochs}: {history[-1]}")

    train_eagle(head, train_seqs, epochs, 1, report)
    return {"training_positions": int(sum(len(ids) - 1 for _, ids, _, _ in train_seqs)), "epochs": epochs,
            "parameters": sum(p.numel() for p in head.parameters()), "output_rows": len(vocab),
            **history[-1], "history": history}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("export", type=Path)
    parser.add_argument("test_streams")
    parser.add_argument("--answers", type=int, default=160, help="own answers to generate for training")
    parser.add_argument("--mlp-epochs", type=int, default=0, help="also train an MLP head (needs torch)")
    parser.add_argument("--eagle-epochs", type=int, default=0,
                        help="also train an EAGLE-style head with one attention layer (needs torch)")
    parser.add_argument("--eagle-weights", type=Path,
                        help="score a head trained elsewhere (`edgespec export head-weights`, .npz)")
    parser.add_argument("--eagle-rows", type=int, default=0,
                        help="with --eagle-weights: keep only the output rows of the N tokens its answers chose most")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().with_name("results"))
    args = parser.parse_args()
    if args.mlp_epochs < 0:
        parser.error("--mlp-epochs must be 0 or more")
    if args.eagle_epochs < 0:
        parser.error("--eagle-epochs must be 0 or more")
    if args.eagle_rows < 0:
        parser.error("--eagle-rows must be 0 (all) or more")
    if args.eagle_weights is not None and not args.eagle_weights.is_file():
        parser.error(f"--eagle-weights {args.eagle_weights}: no such file")
    if (args.mlp_epochs or args.eagle_epochs) and importlib.util.find_spec("torch") is None:
        parser.error("--mlp-epochs and --eagle-epochs need torch: pip install 'edgespec[export-hf]'")
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
    eagle = None
    if args.eagle_epochs > 0 or args.eagle_weights:
        eagle = eagle_probe(probe, train, load_streams(args.test_streams), args.eagle_epochs, args.eagle_weights,
                            args.eagle_rows)
        print(f"{eagle['training_positions']:>8} training positions: EAGLE head top-1 {eagle['top1']:.3f}, "
              f"second step {eagle['step2_top1']:.3f} ({eagle['parameters']:,} parameters, "
              f"{eagle['output_rows']} output rows)")
    (out / "draft_head_probe.json").write_text(json.dumps(
        {"cpu": cpu_identity(), "export": str(args.export), "test_streams": args.test_streams,
         "answers": args.answers, "training_tokens": int(sum(len(s.output) for s in train)),
         "test_positions": len(test_labels), "rows": rows, "mlp": mlp, "eagle": eagle}, indent=1))
    line_chart(out / "draft_head_probe.png", [r["training_positions"] for r in rows],
               [("linear head, top-1", [r["top1"] for r in rows], "tab:blue", "-")],
               "training positions (the model's own answers)", "top-1 agreement on Spec-Bench answers",
               "A linear draft head on the last hidden state")
    print(f"wrote {out / 'draft_head_probe.json'}, draft_head_probe.png")


if __name__ == "__main__":
    main()
