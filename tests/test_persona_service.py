"""The generated customer-service training slice (`llm.persona_service`): every reply it can
teach parses under link-grammar (the judge the replies are scored by; the slice is added
after the training filters, so nothing else checks it), replies carry the caller's noun, and
no bench caller line is trained on."""

from __future__ import annotations

from llm.grammar_judge import LinkGrammarJudge
from llm.persona_service import GROUPS, _norm, all_replies, bench_lines, service_pairs


def test_every_reply_parses() -> None:
    judge = LinkGrammarJudge()
    bad = sorted({r for r in all_replies() if not judge.grammatical(r)})
    assert not bad, bad


def test_replies_echo_the_callers_noun() -> None:
    pairs = service_pairs(seed=3, per_group=50)
    assert len(pairs) > 0.9 * 50 * len(GROUPS)
    for noun in ("subscription", "washing machine", "phone number"):
        echoed = [p for p in pairs if f"your {noun}" in p.response]
        assert echoed and all(noun in p.prompt for p in echoed)
    assert len({p.prompt for p in pairs}) > 0.5 * len(pairs)  # varied callers, not one line per group


def test_no_bench_line_is_trained_on() -> None:
    held = bench_lines()
    assert len(held) > 200  # the dev and test caller lines were read
    assert "yes" in held  # a bench line the slice's frames would otherwise produce
    pairs = service_pairs(seed=0, per_group=400)
    assert not [p.prompt for p in pairs if _norm(p.prompt) in held]
    # nor one whose words are a bench line with a greeting in front ("So, I want a refund.")
    assert not [p.prompt for p in pairs if any(h in _norm(p.prompt) for h in held if h.count(" ") >= 2)]


def test_same_seed_same_slice() -> None:
    assert service_pairs(seed=5, per_group=20) == service_pairs(seed=5, per_group=20)
