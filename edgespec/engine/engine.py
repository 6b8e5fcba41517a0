"""The speculative decoding loop.

prompt → tokens → drafter proposes → γ controller picks how many to verify → target verifies them in
one pass → accept/rollback in the KV arena → γ controller learns → text is streamed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..backends.base import Backend, SelfDraft
from ..controller.cost import MAX_GAMMA, CostCurve
from ..controller.gamma import GammaController
from ..drafters import Draft, Drafter, DraftModelDrafter, NgramDrafter, OutputStore, RecycledDrafter, SuffixDrafter
from ..drafters.proposal import agreed, propose
from ..drafters.tree import TreeDrafter
from ..errors import ContextOverflowError, EdgespecError, InvalidParameterError
from ..tuning.prompts import COST_TEXT
from ..tuning.store import StoredCurve, Tuning
from . import constraints
from .arena import MAX_TREE_LEAVES, Cache, KVArena, TreeCache, common_prefix
from .chat import ChatTemplate, Message
from .constraints import Constraint, guidance_tokenizer
from .prompt_cache import PromptCache
from .rules import Penalties, Rules, TokenLogprob, check_top_logprobs
from .sampling import SamplingParams, sample
from .stats import GenerationStats
from .text import TextStream
from .tools import ChatTurn, ToolCall, ToolReply, chat_turn, toolbox
from .verify import verify_greedy, verify_sampled, verify_tree_greedy, verify_tree_sampled

if TYPE_CHECKING:
    import llguidance

log = logging.getLogger("edgespec.engine")

MODES = ("ngram", "draft", "layerskip", "hybrid", "head", "tree", "none")
SELF_DRAFT_MODES = ("layerskip", "hybrid")  # need a target that can run a subset of its layers
# The layer-skip draft stops at a position whose own top-1 probability is below this (a round value, not tuned).
LAYERSKIP_MIN_CONFIDENCE = 0.5


@dataclass
class StreamChunk:
    """What one verify step added to the output."""

    text: str
    tokens: list[int]
    drafted: int  # draft tokens verified in this step (γ)
    accepted: int  # of those, how many the target kept: tokens[:accepted] came from the drafter
    finish_reason: str | None = None  # "stop" or "length" on the last chunk
    stats: GenerationStats | None = None  # on the last chunk
    logprobs: list[TokenLogprob] | None = None  # one per token, when the request asked for them
    reply: ToolReply | None = None  # on the last chunk of a chat with tools: its text read as content and calls


@dataclass
class Completion:
    text: str  # what the model wrote (with tools: the calls' markup too)
    tokens: list[int]
    finish_reason: str  # "stop", "length", or "tool_calls" when the reply calls tools
    stats: GenerationStats
    logprobs: list[TokenLogprob] | None = None
    reply: ToolReply | None = None  # a chat with tools: the text read as content and tool calls

    @property
    def content(self) -> str:
        """The text for the user: without tools, all of it."""
        return self.reply.content if self.reply is not None else self.text

    @property
    def tool_calls(self) -> list[ToolCall]:
        return list(self.reply.calls) if self.reply is not None else []


class Engine:
    """A target model plus its drafters, sharing one KV arena. Create it with ``edgespec.load``."""

    def __init__(self, target: Backend, draft: Backend | None = None, mode: str | None = None,
                 gamma: int | str = "auto", tuning: Tuning | None = None, stored_curve: StoredCurve | None = None
                 ) -> None:
        self.target = target
        self.tuning = tuning  # from `edgespec tune`: replaces the start-up calibration and seeds the controller
        self.stored_curve = stored_curve  # untuned: an earlier process's calibration, or where to keep this one's
        self.draft_model = draft
        caches: dict[str, Cache] = {"target": target}
        if draft is not None:
            target.check_same_vocab(draft)
            caches["draft"] = draft
        # A target that can skip layers drafts for itself over its own KV memory (a view: see KVArena).
        self_draft = target.self_draft()
        if self_draft is not None:
            caches["layerskip"] = self_draft
        self.arena = KVArena(caches, views={"layerskip": "target"} if self_draft is not None else None)
        self.drafters: dict[str, Drafter] = {"ngram": NgramDrafter()}
        if draft is not None:
            self.drafters["draft"] = DraftModelDrafter(self.arena, "draft")
        if self_draft is not None:
            self.drafters["layerskip"] = DraftModelDrafter(self.arena, "layerskip", "layerskip",
                                                           LAYERSKIP_MIN_CONFIDENCE, self_draft.prepare)
        # A mode is the drafters asked in turn each step; the first draft the γ controller keeps is verified.
        # Hybrid: prompt lookup (free) where the text repeats, else the layer-skip self-draft (a pass per
        # token), each gated by the controller under its own name, and plain decoding when neither pays.
        self.modes: dict[str, tuple[Drafter, ...]] = {"none": ()}
        self.modes.update((name, (drafter,)) for name, drafter in self.drafters.items())
        if "layerskip" in self.drafters:
            self.modes["hybrid"] = (self.drafters["ngram"], self.drafters["layerskip"])
        # Head: lookup where the text repeats, else a trained head reading the target's own hidden states
        # (drafters/head.py), exported beside the model; each gated by the controller as in hybrid.
        head = target.draft_head()
        if head is not None:
            self.drafters["head"] = head
            self.modes["head"] = (self.drafters["ngram"], head)
        # Tree: lookup's chain plus suffix-trie and recycled-logits branches, verified as one token tree where the
        # target's rows are exact for trees (else the best chain of it). Earlier outputs are
        # kept per engine (a server's process), bounded; the store's trie and the recycled table are built at their
        # first use, so an engine that never runs mode tree holds neither.
        self.output_store = OutputStore()
        self.tree_drafter = TreeDrafter(cast(NgramDrafter, self.drafters["ngram"]), SuffixDrafter(self.output_store),
                                        RecycledDrafter(target.n_vocab))
        self.modes["tree"] = (self.tree_drafter,)
        self.mode = mode or ("draft" if draft is not None else "ngram")
        self._check_mode(self.mode)
        self.gamma = check_gamma(gamma)
        self._controller: GammaController | None = None
        self._guidance: llguidance.LLTokenizer | None = None  # the constraints' vocabulary, built at first use
        # Reusing cached prompt tokens is only done where it is exact (see KVArena); the prompt cache keeps
        # other conversations' states when a request replaces the arena's.
        self.prompt_cache = PromptCache()
        if not target.exact_reuse:
            log.warning("prompt reuse is off for %s: here a kept cache prefix is not bit-identical to a fresh "
                        "prefill (fast numerics, passes padded to a fixed shape, or the self-check's reuse probe "
                        "found it so), so every request prefills its whole prompt", target.path.name)
        template = target.chat_template
        self.chat_template = (ChatTemplate(template, target.token_text(target.bos).decode("utf-8", "replace"),
                                           target.token_text(target.eos).decode("utf-8", "replace"))
                              if template else None)

    # -- public API -----------------------------------------------------------------------------------
    @property
    def n_ctx(self) -> int:
        """Tokens a generation can hold, prompt and output together (the smallest context taking part)."""
        return self.arena.n_ctx

    def generate(self, prompt: str | Sequence[int], **kwargs: object) -> Completion:
        """Generate a completion; keyword arguments as for ``stream``."""
        return collect(self.stream(prompt, **kwargs))  # type: ignore[arg-type]

    def chat(self, messages: Sequence[Message], **kwargs: object) -> Completion:
        """A reply in the model's chat template; keyword arguments as for ``stream_chat``."""
        return collect(self.stream_chat(messages, **kwargs))  # type: ignore[arg-type]

    def stream_chat(self, messages: Sequence[Message], *, tools: Sequence[dict[str, Any]] | None = None,
                    tool_choice: str | dict[str, Any] | None = None, parallel_tool_calls: bool | None = None,
                    response_format: dict[str, Any] | None = None, **kwargs: Any) -> Iterator[StreamChunk]:
        """``stream`` for chat messages, in the model's own chat template. ``tools`` (OpenAI's function tools),
        ``tool_choice`` ("auto", the default with tools; "none"; "required"; ``{"type": "function", "function":
        {"name": ...}}``) and ``parallel_tool_calls`` (default false: at most one call per reply) as in OpenAI's
        API: the last chunk's ``reply`` holds the text read as content and tool calls (``tools.py``), and its
        finish_reason is "tool_calls" when there are any. Messages may carry an assistant's ``tool_calls`` and
        ``role: "tool"`` results (``tool_call_id``). ``response_format`` is OpenAI's
        (``constraints.response_format``)."""
        if response_format is not None:
            if kwargs.get("constraint") is not None:
                raise InvalidParameterError("response_format and constraint each constrain the output; pass one")
            kwargs["constraint"] = constraints.response_format(response_format)
        turn = self.chat_turn(messages, tools, tool_choice, parallel_tool_calls)
        if turn.box.active:
            if kwargs.get("constraint") is not None:
                raise InvalidParameterError("a constraint (response_format, a schema, a grammar) and tools cannot "
                                            "be combined: the reply is a tool call or an answer in the tools' "
                                            "format; send tool_choice 'none' to constrain a plain answer",
                                            "response_format")
            kwargs["constraint"] = turn.constraint
        chunks = self.stream(turn.tokens, **kwargs)
        return _read_reply(chunks, turn) if turn.box.active else chunks

    def chat_tokens(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None,
                    tool_choice: str | dict[str, Any] | None = None,
                    parallel_tool_calls: bool | None = None) -> list[int]:
        """The prompt ``stream_chat`` would generate after."""
        return self.chat_turn(messages, tools, tool_choice, parallel_tool_calls).tokens

    def chat_turn(self, messages: Sequence[Message], tools: object = None, tool_choice: object = None,
                  parallel_tool_calls: object = None) -> ChatTurn:
        if self.chat_template is None:
            raise EdgespecError(f"{self.target.path.name} has no chat template; pass a plain prompt instead")
        return chat_turn(self.chat_template, messages, toolbox(tools, tool_choice, parallel_tool_calls),
                         self.target.tokenize)

    def tokenize(self, prompt: str) -> list[int]:
        return self.target.tokenize(prompt, add_special=True, parse_special=False)

    def user_prompt(self, text: str) -> list[int]:
        """``text`` as a user's one-turn prompt: in the model's chat template where it has one, else as it is."""
        if self.chat_template is None:
            return self.tokenize(text)
        return self.chat_tokens([{"role": "user", "content": text}])

    def stream(self, prompt: str | Sequence[int], *, max_tokens: int = 256, temperature: float = 0.0,
               top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, seed: int | None = None,
               stop: str | Sequence[str] | None = (), mode: str | None = None, gamma: int | str | None = None,
               cache_prompt: bool = True, cancel: threading.Event | None = None, constraint: Constraint | None = None,
               presence_penalty: float = 0.0, frequency_penalty: float = 0.0, repetition_penalty: float = 1.0,
               repeat_last_n: int = -1, logprobs: bool = False, top_logprobs: int = 0) -> Iterator[StreamChunk]:
        """Generate token by token, yielding one chunk per verify step.

        Greedy (temperature 0) output is identical to the target decoding alone; sampled output follows
        the target's distribution exactly. Closing the generator cancels the generation. ``cache_prompt``
        (default) reuses the KV of prompt tokens already computed (the arena's or a saved conversation's):
        the output is the same, only the prefill is shorter; False prefills the whole prompt. ``cancel``, set from
        another thread, stops a long prompt's prefill between two of its chunks (the stream then ends without a
        chunk), where closing the generator could only stop it after the whole prompt.

        ``constraint`` (``constraints.py``: a JSON schema, JSON object, regex, choice or grammar) masks every
        token the constraint does not allow; the penalties are OpenAI's presence and frequency penalties (over the
        output) and the repetition penalty over the last ``repeat_last_n`` tokens of prompt and output (-1: all);
        ``logprobs`` puts each token's log-probability on the chunks (``top_logprobs``: and that many of the likeliest
        tokens), taken from the target's logits after the penalties and the constraint, before temperature and
        truncation (edgespec/engine/rules.py). All of them stay exact under speculation.
        """
        params = SamplingParams(temperature, top_k, top_p, min_p, seed)
        mode = mode or self.mode
        self._check_mode(mode)
        gamma = self.gamma if gamma is None else check_gamma(gamma)
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise InvalidParameterError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        stop = _check_stop(stop)
        if not isinstance(cache_prompt, bool):
            raise InvalidParameterError(f"cache_prompt must be true or false, got {cache_prompt!r}")
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        if not tokens:
            raise InvalidParameterError("the prompt is empty")
        n_ctx = self.arena.n_ctx
        if len(tokens) >= n_ctx:
            raise ContextOverflowError(f"the prompt has {len(tokens)} tokens but the context holds {n_ctx}; "
                                       "shorten the prompt or load the model with a larger n_ctx")
        bad = [t for t in tokens if not 0 <= t < self.target.n_vocab]
        if bad:
            raise InvalidParameterError(f"token id {bad[0]} is outside the vocabulary (0..{self.target.n_vocab - 1})")
        rules = self._rules(tokens, constraint, Penalties(presence_penalty, frequency_penalty, repetition_penalty,
                                                          repeat_last_n), logprobs, top_logprobs)
        drafters = self.modes[mode]
        # Plain decoding (mode none) has nothing to choose: no controller, so no cost calibration either.
        controller = self._get_controller() if gamma == "auto" and drafters else None
        return self._run(tokens, params, max_tokens, stop, drafters, gamma, controller, mode, cache_prompt, cancel,
                         rules)

    def _rules(self, prompt: list[int], constraint: Constraint | None, penalties: Penalties, logprobs: bool,
               top_logprobs: int) -> Rules | None:
        """The request's row processing; None when it asks for none (the loop then does no extra work)."""
        if not isinstance(logprobs, bool):
            raise InvalidParameterError(f"logprobs must be true or false, got {logprobs!r}")
        check_top_logprobs(top_logprobs)
        if constraint is not None and not isinstance(constraint, Constraint):
            raise InvalidParameterError("constraint must be made by edgespec.engine.constraints (json_schema, "
                                        "json_object, regex, choice, grammar or response_format), "
                                        f"got {type(constraint).__name__}")
        if constraint is None and not penalties.active and not logprobs:
            return None
        if constraint is not None and self._guidance is None:
            self._guidance = guidance_tokenizer(self.target)
        matcher = constraint.matcher(self._guidance) if constraint is not None else None
        return Rules(self.target.n_vocab, prompt, matcher, penalties, top_logprobs if logprobs else None)

    # -- the loop -------------------------------------------------------------------------------------
    def _run(self, prompt: list[int], params: SamplingParams, max_tokens: int, stop: Sequence[str],
             drafters: tuple[Drafter, ...], gamma: int | str, controller: GammaController | None,
             mode: str, cache_prompt: bool, cancel: threading.Event | None,
             rules: Rules | None = None) -> Iterator[StreamChunk]:
        """prefill → (accept → stream → draft → verify)*: one chunk per verify step."""
        rng = params.rng()
        stats = GenerationStats(mode=mode, prompt_tokens=len(prompt))
        text = TextStream(self.target.piece, stop)
        out: list[int] = []
        start = time.perf_counter()
        first = self._prefill(prompt, cache_prompt, drafters, controller, params, rng, stats, cancel, rules)
        if first is None:  # cancelled during the prefill
            return
        next_token, rows = first
        stats.prefill_s = time.perf_counter() - start
        accepted: list[int] = []
        drafted = 0
        # Trees where the target's tree rows were measured exact (the self-check); else mode tree verifies chains.
        # A constraint or a penalty makes a row depend on the path before it (a matcher state, counts per branch):
        # then mode tree verifies lookup's chain, its spine, and the grammar cuts and forces it like any chain.
        trees = mode == "tree" and rules is None and self.target.exact_trees
        if mode == "tree" and rules is not None:
            mode, drafters = "ngram", (self.drafters["ngram"],)
        while True:
            bookkeeping_start = time.perf_counter()
            new, piece, finish = self._accept(accepted + [next_token], out, text, max_tokens)
            from_draft = min(len(accepted), len(new))
            logprobs = None
            if rules is not None:
                logprobs = rules.logprobs(rows, new)
                rules.commit(new)
            if finish is not None:
                stats.generated_tokens = len(out)
                stats.decode_s = time.perf_counter() - start - stats.prefill_s
                self._keep_learned(controller)
                yield StreamChunk(piece + text.flush(), new, drafted, from_draft, finish, stats, logprobs)
                return
            if controller is not None:
                controller.observe_overhead(time.perf_counter() - bookkeeping_start)
            yield StreamChunk(piece, new, drafted, from_draft, logprobs=logprobs)
            # Accepted draft plus the target's own token must fit the context: target-only stops when it is full
            # (a tree's nodes all take a cell, so they must fit too).
            room = min(max_tokens - len(out) - 1, self.arena.n_ctx - len(self.arena.tokens) - 1, MAX_GAMMA,
                       self._pass_room(trees))
            # Mode none stays the target alone, one token a pass: the reference speculation is checked against.
            forced = rules.forced()[:max(room, 0)] if rules is not None and drafters else []
            if forced:
                accepted, drafted, next_token, rows = self._force(forced, controller, params, rng, stats, rules)
            elif mode == "tree":
                accepted, drafted, next_token, rows = self._speculate_tree(gamma, controller, room, params, rng,
                                                                           stats, trees)
            else:
                accepted, drafted, next_token, rows = self._speculate(drafters, gamma, controller, room, params,
                                                                      rng, stats, rules)

    def _prefill(self, prompt: list[int], cache_prompt: bool, drafters: tuple[Drafter, ...],
                 controller: GammaController | None, params: SamplingParams, rng: np.random.Generator,
                 stats: GenerationStats, cancel: threading.Event | None,
                 rules: Rules | None) -> tuple[int, np.ndarray] | None:
        """Start the sequence (reusing cached tokens), tell the drafters and the controller; the first token and
        its row of logits (processed by ``rules``), or None when ``cancel`` was set before the prompt was in. A draft
        model's cache is prefilled here too (its drafter's ``begin`` then finds it caught up), in cancellable chunks
        like the target's."""
        stats.cached_tokens = self._start_sequence(prompt, cache_prompt)
        caches = ["target", *(d.cache for d in drafters if isinstance(d, DraftModelDrafter))]
        if not all(self.arena.prefill(name, cancel) for name in caches):
            return None
        rows = self.arena.extend("target", [], 1)
        if rules is not None:
            rows, _ = rules.rows(rows, [])
        token = _pick(rows[0], params, rng)
        # After the whole prompt is in: a drafter reading the target's state (the draft head) finds all of it.
        for drafter in drafters:
            drafter.begin(self.arena.tokens)
        if controller is not None:
            controller.begin()
        return token, rows

    def _accept(self, tokens: list[int], out: list[int], text: TextStream,
                max_tokens: int) -> tuple[list[int], str, str | None]:
        """Commit ``tokens`` (the accepted draft, then the target's own token) one at a time, so that EOS, a stop
        string, max_tokens or a full context cut exactly where they occur: the tokens committed, their text, and
        why generation ends (None: it goes on)."""
        new: list[int] = []
        pieces: list[str] = []
        finish = None
        for token in tokens:
            if self.target.is_eog(token):
                finish = "stop"
                break
            new.append(token)
            out.append(token)
            pieces.append(text.push(token))
            if text.stopped:
                finish = "stop"
            elif len(out) == max_tokens:
                finish = "length"
            if finish:
                break
        self.arena.commit(new)
        if finish is None and len(self.arena.tokens) >= self.arena.n_ctx:
            finish = "length"  # the context is full: nothing more can be decoded
        return new, "".join(pieces), finish

    def _speculate(self, drafters: tuple[Drafter, ...], gamma: int | str, controller: GammaController | None,
                   room: int, params: SamplingParams, rng: np.random.Generator, stats: GenerationStats,
                   rules: Rules | None = None) -> tuple[list[int], int, int, np.ndarray]:
        """One speculative step: draft (cut to the chosen γ, and to what ``rules``' grammar allows), verify the draft
        and one more position in one target pass, let the controller learn. Returns the draft tokens the target
        accepted, how many were drafted, the target's own next token, and the pass's rows (processed by ``rules``)."""
        step_start = time.perf_counter()
        draft = propose(drafters, self.arena.tokens, gamma, controller, room, params, rng)  # as replay plays it
        passes = draft.passes
        if rules is not None and draft.tokens:
            allowed = rules.valid_prefix(draft.tokens)
            if allowed < len(draft):
                # No row is spent on a token the grammar refuses; to the controller the refused position counts as
                # tried and rejected (as the target would have rejected it), as a confidence stop's does.
                passes = max(passes or 0, allowed + 1)
                draft = Draft(draft.tokens[:allowed], None if draft.probs is None else draft.probs[:allowed],
                              draft.key, passes, draft.source)
        drafted_at = time.perf_counter()
        logits, n_accepted, next_token = self._verify_chain(draft, params, rng, rules)
        verified_at = time.perf_counter()
        stats.record_step(len(draft), n_accepted, (draft.source,) if draft.source else ())
        stats.draft_s += drafted_at - step_start
        stats.verify_s += verified_at - drafted_at
        if controller is not None:
            controller.observe(draft.source or None, draft.key, len(draft), n_accepted,
                               drafted_at - step_start, verified_at - drafted_at, passes,
                               committed=draft.tokens[:n_accepted] + [next_token])
        return draft.tokens[:n_accepted], len(draft), next_token, logits

    def _force(self, forced: list[int], controller: GammaController | None, params: SamplingParams,
               rng: np.random.Generator, stats: GenerationStats,
               rules: Rules) -> tuple[list[int], int, int, np.ndarray]:
        """A step whose draft is the tokens the grammar forces (jump-forward, at no drafting cost), verified like any
        draft: where the mask leaves the target one token, it is accepted whatever the logits; where it leaves others
        (another tokenization of the same text), the target's own choice decides, as in target-only decoding. No
        drafter is credited: the controller learns the pass's cost only, the stats count the tokens as forced.
        Reported as drafted 0 (no draft text on the chat page)."""
        start = time.perf_counter()
        logits, n_accepted, next_token = self._verify_chain(Draft(forced), params, rng, rules)
        seconds = time.perf_counter() - start
        stats.record_forced(n_accepted)
        stats.verify_s += seconds
        if controller is not None:
            controller.observe(None, 0, len(forced), n_accepted, 0.0, seconds)
        return forced[:n_accepted], 0, next_token, logits

    def _verify_chain(self, draft: Draft, params: SamplingParams, rng: np.random.Generator,
                      rules: Rules | None = None) -> tuple[np.ndarray, int, int]:
        """One target pass over a chain draft and the position after it: the pass's logits (processed by
        ``rules``), how many draft tokens the target accepts (greedy: its argmax; else speculative sampling), and its
        own next token."""
        logits = self.arena.extend("target", draft.tokens, len(draft) + 1)
        probs = draft.probs
        if rules is not None:
            logits, allowed = rules.rows(logits, draft.tokens)
            if probs is not None and allowed is not None:
                # The draft was cut where the grammar refuses a token: the tokens verified are the drafter's draws
                # given that they are allowed, i.e. draws from q masked and renormalized, the q the rule must use.
                probs = np.where(allowed[:len(draft)], probs, 0.0)
                probs /= probs.sum(axis=1, keepdims=True)
        if params.greedy:
            return logits, *verify_greedy(draft.tokens, logits)
        return logits, *verify_sampled(draft.tokens, probs, logits, params, rng)

    def _speculate_tree(self, gamma: int | str, controller: GammaController | None, room: int,
                        params: SamplingParams, rng: np.random.Generator, stats: GenerationStats,
                        trees: bool) -> tuple[list[int], int, int, np.ndarray]:
        """``_speculate`` for mode tree: one pass verifies a token tree where ``trees`` (the target's rows are exact
        for trees: greedy or sampled); elsewhere the tree is shaped as a chain (one leaf) and verified as one.
        The rows of the committed tokens refill the recycled table (not the rejected nodes': what the target would
        say after a context that did not happen, each at the price of a top-k and a normaliser over the vocabulary)."""
        step_start = time.perf_counter()
        budget = min(room, MAX_GAMMA if gamma == "auto" else int(gamma))
        tree, origins = self.tree_drafter.propose_tree(self.arena.tokens, budget, controller,
                                                       MAX_TREE_LEAVES if trees else 1, params, rng)
        drafted_at = time.perf_counter()
        last = self.arena.tokens[-1]
        # A chain that one exact chain pass can take goes as one: a tree pass costs a little more (ONNX: the parents'
        # binding, the kernel's key-by-key path over ancestors).
        if trees and not (tree.is_chain and len(tree) <= self._pass_room(False)):
            parents = tree.parent_list()
            logits = self.arena.extend_tree("target", tree.tokens, parents)
            path, next_token = (verify_tree_greedy(tree.tokens, parents, logits) if params.greedy else
                                verify_tree_sampled(tree.tokens, parents, logits, params, rng))
            self.arena.keep_path("target", path)
        else:
            if not tree.is_chain:  # shaped with one leaf
                raise EdgespecError("internal: a draft tree where only chains are verified")
            logits, n_accepted, next_token = self._verify_chain(tree, params, rng)
            path = list(range(n_accepted))
        verified_at = time.perf_counter()
        accepted = [tree.tokens[i] for i in path]
        self.tree_drafter.observe([last, *accepted], logits, [0, *(i + 1 for i in path)])  # rows, not copies
        self.tree_drafter.learn(tree, origins, path)
        stats.record_step(len(tree), len(path), {name for name, _ in origins})
        stats.draft_s += drafted_at - step_start
        stats.verify_s += verified_at - drafted_at
        if controller is not None:  # the lookup spine is judged from the committed tokens, as in mode ngram
            controller.observe(None, 0, len(tree), len(path), drafted_at - step_start, verified_at - drafted_at,
                               committed=[*accepted, next_token])
        return accepted, len(tree), next_token, logits

    def _pass_room(self, trees: bool) -> int:
        """Draft tokens (tree nodes where ``trees``) the target's next pass can verify exactly: that pass also
        carries the committed tokens its cache lacks (the target's own last token)."""
        start = len(self.arena.held["target"])
        limit = cast(TreeCache, self.target).max_tree_rows(start) if trees else self.target.max_pass_rows(start)
        return limit - (len(self.arena.tokens) - start)

    def _start_sequence(self, prompt: list[int], cache_prompt: bool) -> int:
        """Set the arena to ``prompt``, keeping the cached tokens it starts with; return how many were kept.

        The arena's own entries are saved to the prompt cache first when the prompt drops some of them
        (another conversation may come back); a saved state is restored when it shares more with the prompt.
        """
        arena, cache = self.arena, self.prompt_cache
        if not self.target.exact_reuse:  # nothing cached could be used: no state is worth saving either
            return arena.reset(prompt, reuse=False)
        held = arena.held["target"]
        limit = len(prompt) - 1  # the last prompt token is always fed (see KVArena.reset)
        own = min(common_prefix(held, prompt), limit)
        if own < len(held) and cache.max_bytes > 0:
            state = arena.snapshot()
            if state is not None:
                cache.put(state)
        if cache_prompt:
            saved, _ = cache.best(prompt[:limit], longer_than=own)
            if saved is not None:
                arena.restore(saved)
        return arena.reset(prompt, cache_prompt)

    # -- setup ----------------------------------------------------------------------------------------
    @property
    def controller(self) -> GammaController | None:
        """The γ controller of this engine's γ-auto generations (what it has learned), None before the first."""
        return self._controller

    def _get_controller(self) -> GammaController:
        if self._controller is None:
            t = self.tuning
            self._controller = (self._untuned_controller() if t is None else
                                GammaController(t.curve(), t.acceptance, t.draft_cost_s, t.overhead_s))
            rows = self.target.pass_rows
            if rows:  # a target that pads its passes (the self-check's choice on a GPU) pays the same for all
                self._controller.curve.pad_to(rows)
        return self._controller

    def _untuned_controller(self) -> GammaController:
        """Costs measured now; acceptance learned as it goes, except the layer-skip draft's, whose
        calibration (when it is the calibrated set) says how often it agrees and what a draft token costs:
        a self-draft that cannot pay is then declined from the first step instead of after a costly start."""
        curve = self.stored_curve.read() if self.stored_curve is not None else None
        if curve is None:
            curve = self.calibrate()
            # A calibration cut to a small context (less text, the longest passes not timed) is this process's
            # only: the next one on this model, with room, measures the whole curve for every later process.
            if self.stored_curve is not None and self._calibration_text()[1]:
                self.stored_curve.write(curve)
        view = cast("SelfDraft | None", self.arena.caches.get("layerskip"))  # the target's self_draft()
        estimate = view.calibrated if view is not None else None
        if estimate is None:
            controller = GammaController(curve)
        else:
            agreement, cost_ratio = estimate
            controller = GammaController(curve, {"layerskip": [agreement]}, {"layerskip": cost_ratio * curve.scale})
        learned = self.stored_curve.read_learned() if self.stored_curve is not None else None
        if learned is not None:
            try:
                controller.start_from(learned)  # warm from the first step: what earlier processes learned
            except ValueError as e:
                log.warning("ignoring %s: %s", self.stored_curve.learned_path, e)  # type: ignore[union-attr]
            else:
                kept = learned.get("identities")
                for name, identity in self._identities().items():
                    if not isinstance(kept, dict) or kept.get(name) != identity:
                        controller.forget(name)  # learned of another head (one exported since)
        return controller

    def _identities(self) -> dict[str, str]:
        """Which drafter each name stands for, where it can be another one from process to process (an
        ``identity``): the draft head, whose name stays when it is exported again, while what its predecessor's
        keys were worth says nothing of it."""
        own = {name: identity for name, drafter in self.drafters.items()
               if (identity := getattr(drafter, "identity", ""))}
        # What agreement with such a drafter was worth (``proposal.agreed``) goes with it.
        pairs = {agreed(first.name, second.name): own[second.name] for mode in self.modes.values()
                 for first, second in pairwise(mode) if second.name in own}
        return {**own, **pairs}

    def _keep_learned(self, controller: GammaController | None) -> None:
        """After a request, what the untuned controller has learned, for the next process (``StoredCurve``)."""
        if controller is not None and self.tuning is None and self.stored_curve is not None:
            self.stored_curve.write_learned({**controller.learned(), "identities": self._identities()})

    def _calibration_text(self, context: Sequence[int] | None = None) -> tuple[list[int], bool]:
        """The tokens the calibration runs after (``context``, default a ~100-token text), cut to leave room for its
        longest pass where the context is small, and whether they are all of them."""
        text = list(context) if context is not None else self.tokenize(COST_TEXT)
        kept = text[:max(1, self.arena.n_ctx - (MAX_GAMMA + 1))]
        return kept, len(kept) == len(text)

    def calibrate(self, rounds: int = 3, statistic: Callable[[list[float]], float] = np.median,
                  context: Sequence[int] | None = None) -> CostCurve:
        """Measure what one target pass over k tokens costs on this machine, k = 1..MAX_GAMMA+1, after
        ``context`` (default: a ~100-token text; passes get dearer as the context grows). In a context too small for
        that text and the passes (a first use with a small n_ctx), less of the text; a pass that would not fit at all
        is timed at the most tokens that do, which no step can exceed there either."""
        arena = self.arena
        arena.reset(self._calibration_text(context)[0])
        arena.extend("target", [], 1)
        filler = arena.tokens[-1]
        room = arena.n_ctx - len(arena.tokens)

        def run(k: int) -> None:
            k = min(k, room)
            arena.extend("target", [filler] * k, k)
            arena.commit([])  # rolls the k tokens back

        return CostCurve.measure(run, rounds, statistic)

    def _check_mode(self, mode: str) -> None:
        if mode not in MODES:
            raise InvalidParameterError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if mode == "head" and mode not in self.modes:
            raise InvalidParameterError("mode 'head' needs a draft head trained for this model: an ONNX export "
                                        "with one beside it (`edgespec export head EXPORT`, docs/draft-head.md)")
        if mode in SELF_DRAFT_MODES and mode not in self.modes:
            raise InvalidParameterError(f"mode {mode!r} needs a model that can run a subset of its layers: an ONNX "
                                        "export (`edgespec export onnx`); llama.cpp cannot skip layers")
        if mode not in self.modes:
            raise InvalidParameterError(f"mode {mode!r} needs a draft model: load one with draft=PATH")

    def close(self) -> None:
        self.target.close()
        if self.draft_model is not None:
            self.draft_model.close()


def _read_reply(chunks: Iterator[StreamChunk], turn: ChatTurn) -> Iterator[StreamChunk]:
    """``chunks`` with the whole text read for tool calls on the last one (``StreamChunk.reply``)."""
    pieces: list[str] = []
    try:
        for chunk in chunks:
            pieces.append(chunk.text)
            if chunk.finish_reason is not None:
                reply = turn.reply("".join(pieces), chunk.finish_reason)
                chunk = replace(chunk, reply=reply,
                                finish_reason="tool_calls" if reply and reply.calls else chunk.finish_reason)
            yield chunk
    finally:
        cast(Generator[StreamChunk, None, None], chunks).close()  # closing this stream cancels the generation


def collect(chunks: Iterable[StreamChunk], on_text: Callable[[str], None] | None = None) -> Completion:
    """Gather a stream into one Completion, handing each piece of text to ``on_text`` as it arrives."""
    pieces: list[str] = []
    tokens: list[int] = []
    logprobs: list[TokenLogprob] | None = None
    for chunk in chunks:
        if on_text is not None:
            on_text(chunk.text)
        pieces.append(chunk.text)
        tokens.extend(chunk.tokens)
        if chunk.logprobs is not None:
            logprobs = (logprobs or []) + chunk.logprobs
    assert chunk.finish_reason is not None and chunk.stats is not None  # the last chunk always has both
    return Completion("".join(pieces), tokens, chunk.finish_reason, chunk.stats, logprobs, chunk.reply)


def check_gamma(gamma: int | str) -> int | str:
    if gamma == "auto":
        return gamma
    if isinstance(gamma, str) and gamma.isdigit():
        gamma = int(gamma)
    if not isinstance(gamma, int) or isinstance(gamma, bool) or not 0 <= gamma <= MAX_GAMMA:
        raise InvalidParameterError(f"gamma must be 'auto' or an integer in 0..{MAX_GAMMA}, got {gamma!r}")
    return gamma


def _check_stop(stop: object) -> list[str]:
    """Stop strings: one string, a sequence of them, or None for none (as a null ``stop`` in a request)."""
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if not isinstance(stop, Sequence) or not all(isinstance(s, str) for s in stop):
        raise InvalidParameterError(f"stop must be a string or a sequence of strings, got {stop!r:.80}")
    return list(stop)


def _pick(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """The target's token from one row of logits: argmax when greedy, else a sample."""
    if params.greedy:
        return int(logits.argmax())
    return sample(params.probs(logits)[0], rng)
