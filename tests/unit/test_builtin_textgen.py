"""The builtin engine's text: deterministic, prefix-stable, continuable, stop rules exact."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simengine.textgen import (
    Sampling,
    context_of,
    context_of_ids,
    generate,
    natural_length,
    plan_output,
    prompt_digest,
)
from simengine.tokenizer import render_chat, tokenize

GREEDY = Sampling(temperature=0.0)
SEEDED = Sampling(temperature=0.8, top_p=0.9, seed=7)


def test_same_context_same_text() -> None:
    a = generate(context_of("Tell me a story"), SEEDED, 40)
    b = generate(context_of("Tell me a story"), SEEDED, 40)
    assert a == b


@pytest.mark.parametrize(
    ("other_prompt", "other_sampling"),
    [
        ("Tell me a poem", SEEDED),  # prompt matters
        ("Tell me a story", Sampling(temperature=0.8, top_p=0.9, seed=8)),  # seed matters when sampling
        ("Tell me a story", Sampling(temperature=1.5, top_p=0.9, seed=7)),  # temperature matters
        ("Tell me a story", GREEDY),
    ],
)
def test_prompt_and_sampling_change_the_text(other_prompt: str, other_sampling: Sampling) -> None:
    base = generate(context_of("Tell me a story"), SEEDED, 40)
    assert generate(context_of(other_prompt), other_sampling, 40) != base


def test_greedy_ignores_the_seed() -> None:
    a = generate(context_of("x y z"), Sampling(temperature=0.0, seed=1), 20)
    b = generate(context_of("x y z"), Sampling(temperature=0.0, seed=2), 20)
    assert a == b


def test_whitespace_in_the_prompt_does_not_change_the_key_but_spacing_is_kept() -> None:
    # The fold ignores whitespace, so how a continuation re-tokenizes cannot change the text.
    assert context_of("a  b\n c").key == context_of("ab c").key


@given(st.text(min_size=1, max_size=60), st.integers(0, 30), st.booleans())
@settings(max_examples=60, deadline=None)
def test_completion_continuation_gives_the_same_tokens(prompt: str, k: int, greedy: bool) -> None:
    sampling = GREEDY if greedy else SEEDED
    full = generate(context_of(prompt), sampling, 30)
    assert generate(context_of(prompt + "".join(full[:k])), sampling, 30 - k) == full[k:]


@pytest.mark.parametrize("k", [0, 1, 5, 17])
def test_chat_continue_final_message_gives_the_same_tokens(k: int) -> None:
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is NATS?"}]
    full = generate(context_of(render_chat(msgs)), SEEDED, 25)
    partial = [*msgs, {"role": "assistant", "content": "".join(full[:k])}]
    text = render_chat(partial, add_generation_prompt=False, continue_final_message=True)
    assert generate(context_of(text), SEEDED, 25 - k) == full[k:]


def test_tokens_concatenate_to_text_that_tokenizes_back() -> None:
    toks = generate(context_of("Once upon a time"), SEEDED, 50)
    assert tokenize("".join(toks)) == toks


def test_chat_answer_starts_capitalized_without_space() -> None:
    first = generate(context_of(render_chat([{"role": "user", "content": "hi"}])), GREEDY, 1)[0]
    assert first[0].isupper() and not first.startswith(" ")


def test_token_id_prompts_are_deterministic() -> None:
    assert generate(context_of_ids([1, 2, 3]), GREEDY, 10) == generate(context_of_ids([1, 2, 3]), GREEDY, 10)
    assert generate(context_of_ids([1, 2, 3]), GREEDY, 10) != generate(context_of_ids([1, 2, 4]), GREEDY, 10)


def test_precision_fault_is_garbage_of_the_same_length() -> None:
    good = generate(context_of("p"), GREEDY, 12)
    bad = generate(context_of("p"), GREEDY, 12, garbage=True)
    assert len(bad) == len(good) and bad != good
    assert any("NaN" in t or "nan" in t for t in bad)


def test_plan_is_prefix_stable_in_max_tokens() -> None:
    ctx = context_of("Explain KV caches")
    long = plan_output(ctx, SEEDED, 40, 40)
    short = plan_output(ctx, SEEDED, 7, 7)
    assert long.pieces[:7] == short.pieces
    assert (short.finish_reason, short.completion_tokens) == ("length", 7)


def test_natural_length_ends_with_stop() -> None:
    plan = plan_output(context_of("x"), GREEDY, 100, 10)
    assert (plan.finish_reason, plan.completion_tokens, plan.stop_reason) == ("stop", 10, None)


def test_ignore_eos_runs_to_max_tokens() -> None:
    plan = plan_output(context_of("x"), Sampling(temperature=0.0, ignore_eos=True), 100, 10)
    assert (plan.finish_reason, plan.completion_tokens) == ("length", 100)


def test_min_tokens_delays_a_natural_end() -> None:
    plan = plan_output(context_of("x"), Sampling(temperature=0.0, min_tokens=30), 100, 10)
    assert plan.completion_tokens == 30


def test_natural_length_is_stable_and_in_range() -> None:
    d = prompt_digest(tokenize("hello"))
    values = {natural_length(d, SEEDED, 64, 256) for _ in range(3)}
    assert len(values) == 1 and 64 <= values.pop() <= 256


def test_stop_string_cuts_text_and_counts_the_token_that_completed_it() -> None:
    toks = generate(context_of("The report"), GREEDY, 30)
    target = toks[5]  # e.g. " word"
    plan = plan_output(context_of("The report"), Sampling(temperature=0.0, stop=(target.strip(),)), 30, 30)
    text = "".join(toks)
    cut = text.find(target.strip())
    assert plan.text == text[:cut]
    assert plan.finish_reason == "stop" and plan.stop_reason == target.strip()
    assert "".join(plan.pieces) == plan.text
    assert plan.completion_tokens <= 6


def test_stop_string_spanning_tokens_cuts_earlier_pieces() -> None:
    toks = generate(context_of("The report"), GREEDY, 30)
    stop = (toks[3] + toks[4]).strip()
    plan = plan_output(context_of("The report"), Sampling(temperature=0.0, stop=(stop,)), 30, 30)
    text = "".join(toks)
    assert plan.text == text[: text.find(stop)]
    assert "".join(plan.pieces) == plan.text
    assert plan.completion_tokens == 5


def test_include_stop_str_in_output() -> None:
    toks = generate(context_of("The report"), GREEDY, 30)
    stop = toks[4].strip()
    s = Sampling(temperature=0.0, stop=(stop,), include_stop_str_in_output=True)
    plan = plan_output(context_of("The report"), s, 30, 30)
    assert plan.text.endswith(stop)


def test_earliest_stop_wins() -> None:
    toks = generate(context_of("The report"), GREEDY, 30)
    a, b = toks[2].strip(), toks[8].strip()
    plan = plan_output(context_of("The report"), Sampling(temperature=0.0, stop=(b, a)), 30, 30)
    assert plan.stop_reason == a


def test_stop_not_found_runs_to_length() -> None:
    plan = plan_output(context_of("The report"), Sampling(temperature=0.0, stop=("zzzz",)), 12, 12)
    assert (plan.finish_reason, plan.stop_reason, plan.completion_tokens) == ("length", None, 12)
