"""Training a draft head (EAGLE, Li et al. 2024) on the target's own answers: ``edgespec export head-weights``.

The text is the target's own sampled answers to prompts written here from templates of everyday chat tasks
(explaining, listing, writing, coding, arithmetic, translating, role-play; nothing from any benchmark): what the
head must learn is what *this* model says next, so the model itself writes its training text. transformers runs the
GGUF's weights (dequantized to F32) to sample the answers and compute each position's last hidden state; on a GPU
the whole run takes minutes (docs/draft-head.md), on 2 CPU cores hours at the default size.
Needs torch and transformers (the ``export-hf`` extra); the result is a numpy file that ``export head --weights``
writes as ONNX without them.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from edgespec.errors import EdgespecError

from .. import require

TOPICS = ("the water cycle", "photosynthesis", "the French Revolution", "machine learning", "climate change",
          "the stock market", "healthy sleep habits", "the history of the bicycle", "black holes", "the Roman Empire",
          "electric cars", "volcanoes", "the human immune system", "coffee", "the internet", "renewable energy",
          "the Great Wall of China", "honey bees", "chess openings", "the printing press", "vaccines", "earthquakes",
          "jazz music", "the Moon landing", "recycling", "inflation", "the Olympic Games", "meditation", "DNA",
          "rainforests", "public transportation", "the Renaissance", "social media", "ocean tides", "gardening",
          "artificial satellites", "the piano", "democracy", "dinosaurs", "time management", "the human heart",
          "ancient Egypt", "cloud computing", "bread baking", "the solar system", "World War I", "nutrition",
          "smartphones", "the theory of evolution", "bird migration", "the Industrial Revolution", "cybersecurity",
          "the Amazon river", "volunteering", "quantum computers", "the French language", "the water footprint of food",
          "urban planning", "the history of money", "friendship", "the immune response to allergies", "glaciers",
          "3D printing", "the Silk Road", "remote work", "mushrooms", "the speed of light", "public libraries",
          "nuclear energy", "the human brain", "cats and dogs as pets", "the Mona Lisa", "wind turbines",
          "learning a new language", "the ozone layer", "basketball")
TEMPLATES = ("Explain {t} in simple terms.", "Write a short essay about {t}.",
             "What are three interesting facts about {t}?", "Give me a list of pros and cons of {t}.",
             "Write a short poem about {t}.", "How would you teach a child about {t}?",
             "Summarize the main ideas of {t} in one paragraph.", "Write a friendly email to a colleague about {t}.",
             "What is the difference between {t} and {u}?", "Write a story for kids that involves {t}.",
             "List five questions a student might ask about {t}, with answers.", "Why is {t} important?",
             "What are common misconceptions about {t}?", "Write a blog post introduction about {t}.",
             "Describe the history of {t} briefly.", "Compare {t} and {u} in a short table.",
             "Give a one-sentence definition of {t}, then explain it.", "What would happen if {t} disappeared?",
             "Write a dialogue between two friends discussing {t}.", "Create a short quiz about {t}.")
# Other kinds of request, each with its own fillers: code, arithmetic, translation, role-play, advice.
TASKS = (
    (("Write a Python function that {t}.", "How do I {t} in JavaScript? Show the code.",
      "Write a C function that {t}, and explain it.", "What is the fastest way to {t} in Python?"),
     ("reverses a string", "checks whether a number is prime", "sorts a list of dictionaries by a key",
      "counts the words in a text file", "finds the largest element of a list", "merges two sorted lists",
      "computes the Fibonacci numbers", "removes duplicates from a list", "parses a date from a string",
      "reads a CSV file and sums a column", "converts Celsius to Fahrenheit", "validates an email address")),
    (("Solve step by step: {t}", "A student asks: {t} Explain the answer.", "Check this problem and solve it: {t}"),
     ()),  # arithmetic: filled by _arithmetic
    (("Translate into {lang}: {t}", "How do you say this in {lang}? {t}"),
     ("Where is the nearest train station?", "I would like to book a table for two tonight.",
      "The meeting has been moved to Thursday afternoon.", "Thank you very much for your help yesterday.",
      "Could you please send me the report by Friday?", "The weather is lovely today, let's go for a walk.")),
    (("Pretend you are {t}. Introduce yourself and describe a typical day.",
      "You are {t}. A visitor asks you for advice. What do you say?"),
     ("a pirate captain", "a medieval knight", "a tour guide in Rome", "a friendly robot", "a detective in London",
      "a chef in a busy restaurant", "an astronaut on the space station", "a wise old wizard")),
    (("I need advice: {t} What should I do?", "Give me a step-by-step plan: {t}"),
     ("I want to learn to cook healthy meals on a budget.", "I have trouble waking up early.",
      "I am preparing for my first job interview.", "I want to start running but I get tired quickly.",
      "My team keeps missing deadlines.", "I want to save money for a trip next year.")),
)
LANGUAGES = ("French", "German", "Spanish", "Italian", "Chinese")
MLP_HIDDEN = 1536  # the SwiGLU width of the head's layer: SmolLM2's own


def _arithmetic(rnd: random.Random) -> str:
    a, b, c = rnd.randint(2, 99), rnd.randint(2, 99), rnd.randint(2, 12)
    return rnd.choice((f"A shop sells {a} apples a day for {c} days. How many apples is that?",
                       f"What is {a} times {b} minus {c}?",
                       f"Tom has {a} dollars and spends {b % a + 1} of them. How much is left?",
                       f"A train travels {a * c} km in {c} hours. What is its average speed?",
                       f"If x + {a} = {a + b}, what is x?"))


def prompts(count: int, seed: int = 7) -> list[str]:
    """``count`` requests from the templates above, about half of them explanations and essays."""
    rnd = random.Random(seed)
    general = [(t, topic) for t in TEMPLATES for topic in TOPICS]
    rnd.shuffle(general)
    out: list[str] = []
    for i in range(count):
        if i % 2 == 0:
            template, topic = general[(i // 2) % len(general)]
            out.append(template.format(t=topic, u=rnd.choice([t for t in TOPICS if t != topic])))
        else:
            templates, fillers = rnd.choice(TASKS)
            filler = rnd.choice(fillers) if fillers else _arithmetic(rnd)
            out.append(rnd.choice(templates).format(t=filler, lang=rnd.choice(LANGUAGES)))
    return out


def eagle_module(width: int, heads: int, embed: np.ndarray, rows: np.ndarray, vocab: np.ndarray) -> object:
    """EAGLE's draft head, scaled to the model: at every position i, [f_i, embedding(x_{i+1})] → a linear map to the
    width → one decoder layer (RMSNorm, causal attention over all earlier positions with rotary positions on
    adjacent pairs, RMSNorm, SwiGLU MLP) → f̂_{i+1}, the target's next last hidden state (before its final norm,
    scaled to unit RMS); the target's own head (final norm + output projection: ``rows`` = √width · g_i · W[:, i],
    limited to the tokens ``vocab``) turns f̂_{i+1} into a guess for x_{i+2}."""
    torch = require("torch", "export-hf")
    dim = width // heads

    class EagleHead(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("embed", torch.tensor(embed))
            self.register_buffer("out_rows", torch.tensor(rows[:, vocab]) / width ** 0.5)  # (f/rms(f)) @ rows/√w
            self.register_buffer("vocab", torch.tensor(vocab))
            self.fuse = torch.nn.Linear(2 * width, width, bias=False)
            self.norm1, self.norm2 = torch.nn.RMSNorm(width), torch.nn.RMSNorm(width)
            self.qkv = torch.nn.Linear(width, 3 * width, bias=False)
            self.o = torch.nn.Linear(width, width, bias=False)
            self.up = torch.nn.Linear(width, 2 * MLP_HIDDEN, bias=False)
            self.down = torch.nn.Linear(MLP_HIDDEN, width, bias=False)

        def forward(self, f: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
            """f [batch, n, width], tokens [batch, n] = x_{i+1}: f̂_{i+1} for every i, attending to positions ≤ i
            (a batch's shorter sequences padded at the end)."""
            b, n = tokens.shape
            z = self.fuse(torch.cat([f, self.embed[tokens]], -1))
            q, k, v = self.qkv(self.norm1(z)).view(b, n, 3, heads, dim).unbind(2)
            angle = torch.arange(n, device=f.device)[:, None] * 10000.0 ** (
                -torch.arange(0, dim, 2, device=f.device) / dim)
            cos, sin = angle.cos()[:, None], angle.sin()[:, None]

            def rotate(x: torch.Tensor) -> torch.Tensor:
                a, c = x[..., ::2], x[..., 1::2]
                return torch.stack([a * cos - c * sin, a * sin + c * cos], -1).flatten(-2)

            att = torch.nn.functional.scaled_dot_product_attention(
                rotate(q).transpose(1, 2), rotate(k).transpose(1, 2), v.transpose(1, 2), is_causal=True)
            z = z + self.o(att.transpose(1, 2).reshape(b, n, width))
            gate, up = self.up(self.norm2(z)).chunk(2, -1)
            return z + self.down(torch.nn.functional.silu(gate) * up)

        def logits(self, f: torch.Tensor) -> torch.Tensor:
            return (f / f.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()) @ self.out_rows

    # Its initial weights are its own (seed 0), not whatever earlier work left in torch's global generator: a head
    # trained on a few answers learns them well or less well by its start.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return EagleHead()


Answer = tuple[np.ndarray, np.ndarray, np.ndarray, int]  # features (unit RMS), ids, the target's choices, prompt


def train_eagle(head: object, train: list[Answer], epochs: int, batch: int, report: Callable[[int], None]) -> None:
    """Teacher forcing on the target's own features (small noise added, as EAGLE does); loss = smooth-L1 on the
    feature + cross-entropy on the token (EAGLE weighs the token 0.1 at 7B; here its top-1 is what is asked)."""
    torch = require("torch", "export-hf")
    torch.manual_seed(0)
    width, device = train[0][0].shape[1], head.embed.device  # type: ignore[attr-defined]
    index = torch.full((len(head.embed),), -1, dtype=torch.long, device=device)  # type: ignore[attr-defined]
    index[head.vocab] = torch.arange(len(head.vocab), device=device)  # type: ignore[attr-defined]
    opt = torch.optim.AdamW(head.parameters(), lr=1e-3, weight_decay=0.01)  # type: ignore[attr-defined]
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3,
                                                   total_steps=epochs * ((len(train) + batch - 1) // batch))
    for epoch in range(epochs):
        order = np.random.default_rng(epoch).permutation(len(train))
        for first in range(0, len(train), batch):
            part = [train[j] for j in order[first:first + batch]]
            n = max(len(ids) for _, ids, _, _ in part) - 1
            f = torch.zeros(len(part), n + 1, width)
            ids = torch.zeros(len(part), n + 1, dtype=torch.long)
            labels = torch.full((len(part), n), -1, dtype=torch.long)
            for r, (fs, tokens, choice, _) in enumerate(part):
                f[r, :len(tokens)], ids[r, :len(tokens)] = torch.tensor(fs), torch.tensor(tokens)
                labels[r, :len(tokens) - 1] = torch.tensor(choice[1:])  # at i: the target's choice at i + 1
            f, ids, labels = f.to(device), ids.to(device), labels.to(device)
            valid = labels >= 0
            known = index[labels.clamp(min=0)] >= 0
            known &= valid
            pred = head(f[:, :n] + (torch.rand_like(f[:, :n]) - 0.5) * 0.2, ids[:, 1:])  # type: ignore[operator]
            loss = torch.nn.functional.smooth_l1_loss(pred[valid], f[:, 1:][valid]) + \
                torch.nn.functional.cross_entropy(head.logits(pred[known]), index[labels[known]])  # type: ignore[attr-defined]
            opt.zero_grad()
            loss.backward()
            opt.step()
            schedule.step()
        report(epoch)


def held_out_top1(head: object, data: list[Answer]) -> float:
    """How often the head's first guess is the target's choice, on answers it was not trained on (positions in the
    answers where the token that followed was the target's greedy choice, as when drafting)."""
    torch = require("torch", "export-hf")
    right = total = 0
    head.eval()  # type: ignore[attr-defined]
    with torch.no_grad():
        for f, ids, choice, prompt in data:
            device = head.embed.device  # type: ignore[attr-defined]
            f, tokens, choice_t = (torch.tensor(a, device=device) for a in (f, ids, choice))
            pred = head(f[None, :-1], tokens[None, 1:])[0]  # type: ignore[operator]
            guess = head.vocab[head.logits(pred).argmax(-1)]  # type: ignore[attr-defined]
            t = torch.arange(prompt - 1, len(ids) - 2, device=device)
            t = t[tokens[t + 1] == choice_t[t]]
            right, total = right + int((guess[t] == choice_t[t + 1]).sum()), total + len(t)
    head.train()  # type: ignore[attr-defined]
    return right / max(total, 1)


def train_head(gguf: Path, out: Path, count: int = 2400, samples: int = 4, epochs: int = 10, max_tokens: int = 256,
               device: str = "auto", log: Callable[[str], None] = print, sampling_seconds: float = 0.0) -> dict:
    """Sample ``samples`` answers to each of ``count`` prompts from the GGUF's model, train the head on their
    features for ``epochs`` and save it to ``out`` (.npz: the parameters, the output rows' tokens by how often the
    answers chose them, the feature scale, the run's figures). With ``sampling_seconds``, answers stop being
    sampled once that long has passed since the start (a GPU lent for minutes): the head trains on those sampled by
    then. Returns the figures."""
    torch = require("torch", "export-hf")
    require("transformers", "export-hf")
    from transformers import AutoTokenizer

    from edgespec.bench.peers.hf import load_dequantized

    if min(count, samples, epochs, max_tokens) < 1 or sampling_seconds < 0:
        raise EdgespecError("prompts, samples, epochs and max tokens must be 1 or more, sampling seconds 0 or more")
    started = time.time()
    torch.manual_seed(0)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    model = load_dequantized(gguf).to(device)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    eos = model.generation_config.eos_token_id
    eos = int(eos if isinstance(eos, int) else eos[0])
    ids = [list(tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                              tokenize=True, return_dict=False))
           for p in prompts(count)]
    deadline = started + sampling_seconds if sampling_seconds else float("inf")
    sequences: list[tuple[list[int], int]] = []
    for _ in range(samples):
        answers = _sample(model, eos, ids, 256 if device != "cpu" else 32, max_tokens, deadline)
        sequences += [([*p, *a], len(p)) for p, a in zip(ids, answers, strict=False)]
        log(f"  {len(sequences)} answers sampled ({time.time() - started:.0f} s)")
        if time.time() > deadline:
            log(f"  sampling stopped after {sampling_seconds:.0f} s")
            break
    captured: list = []
    model.model.norm.register_forward_hook(lambda _m, inputs, _o: captured.append(inputs[0]))
    data: list[Answer] = []
    for first in range(0, len(sequences), 32):
        part = sequences[first:first + 32]
        width = max(len(s) for s, _ in part)
        x = torch.tensor([s + [eos] * (width - len(s)) for s, _ in part], device=device)
        captured.clear()
        with torch.no_grad():
            choices = model(input_ids=x).logits.argmax(-1).cpu().numpy()
        features = captured[0].float().cpu().numpy()
        data += [(features[r, :len(s)], np.asarray(s), choices[r, :len(s)], p) for r, (s, p) in enumerate(part)]
    scale = float(np.sqrt(np.mean(np.concatenate([f[::7] for f, *_ in data]) ** 2)))
    data = [(f / scale, s, choice, p) for f, s, choice, p in data]
    held_out = data[::20]  # every 20th answer: a check on the fit (its prompt is trained on in other samples)
    train = [d for j, d in enumerate(data) if j % 20]
    positions = int(sum(len(s) - 1 for _, s, _, _ in train))
    log(f"  features of {len(data)} answers, {positions} training positions ({time.time() - started:.0f} s)")
    config = model.config
    width = config.hidden_size
    with torch.no_grad():  # as the runtime sees them: the model's own modules, whatever their scaling (Gemma's)
        # The final norm and output projection on scaled one-hot rows: √width · g_i · W[:, i] (draft_head.output_rows)
        rows = model.lm_head(model.model.norm(torch.eye(width, device=device) * 1000.0)).float().cpu().numpy()
        embed = model.get_input_embeddings()(torch.arange(rows.shape[1], device=device)).float().cpu().numpy()
    counts = np.bincount(np.concatenate([c for *_, c, _ in train]), minlength=rows.shape[1])
    vocab = np.flatnonzero(counts)
    head = eagle_module(width, config.num_attention_heads, embed, rows, vocab).to(device)
    figures: dict = {"prompts": count, "samples": samples, "sampled": len(sequences), "answers": len(train),
                     "training_positions": positions, "epochs": epochs, "device": device, "gguf": gguf.name}

    def report(epoch: int) -> None:
        figures["held_out_top1"] = round(held_out_top1(head, held_out[:60]), 4)
        figures["seconds"] = round(time.time() - started, 1)
        state = {k: v.detach().half().cpu().numpy() for k, v in head.state_dict().items()
                 if k not in ("embed", "out_rows", "vocab")}
        save_weights(out, state, vocab, counts[vocab], scale, figures)
        log(f"  epoch {epoch + 1}/{epochs} ({figures['seconds']:.0f} s): held-out top-1 {figures['held_out_top1']}")

    train_eagle(head, train, epochs, 32, report)
    return figures


def _sample(model: object, eos: int, requests: list[list[int]], batch: int, max_tokens: int,
            deadline: float) -> list[list[int]]:
    """The model's answer to each request (temperature 0.8, top-p 0.95), in order, ``batch`` at a time until the
    deadline passes (one batch at least: something to train on)."""
    torch = require("torch", "export-hf")
    device = model.device  # type: ignore[attr-defined]
    answers: list[list[int]] = []
    for first in range(0, len(requests), batch):
        if answers and time.time() > deadline:
            break
        part = requests[first:first + batch]
        width = max(map(len, part))
        x = torch.tensor([[eos] * (width - len(p)) + p for p in part], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in part], device=device)
        with torch.no_grad():
            generated = model.generate(input_ids=x, attention_mask=mask, do_sample=True,  # type: ignore[attr-defined]
                                       temperature=0.8, top_p=0.95, max_new_tokens=max_tokens, pad_token_id=eos,
                                       eos_token_id=eos)
        answers += [row[:row.index(eos) if eos in row else len(row)] for row in generated[:, width:].tolist()]
    return answers


def save_weights(path: Path, state: dict[str, np.ndarray], vocab: np.ndarray, counts: np.ndarray, scale: float,
                 figures: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:  # np.savez would append .npz to a name without it
        np.savez(f, vocab=vocab, counts=counts, scale=np.float64(scale), figures=np.array(json.dumps(figures)),
                 **{"state." + k: v for k, v in state.items()})


def load_weights(path: Path, rows: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray, float, dict]:
    """A head saved by ``train_head``: its parameters (float32), its output rows' tokens (the ``rows`` the answers
    chose most when given; fewer rows, a cheaper head), the feature scale and the run's figures."""
    try:
        with np.load(path) as z:
            state = {k[len("state."):]: z[k].astype(np.float32) for k in z.files if k.startswith("state.")}
            vocab, counts, scale, figures = z["vocab"], z["counts"], float(z["scale"]), json.loads(str(z["figures"]))
    except (OSError, ValueError, KeyError) as e:
        raise EdgespecError(f"{path} is not a draft head saved by `edgespec export head-weights`: {e}") from e
    if rows and rows < len(vocab):
        vocab = np.sort(vocab[np.argsort(-counts, kind="stable")[:rows]])
    return state, vocab, scale, figures
