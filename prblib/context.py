"""The one renderer of what a model is told about the person: every place where a profile (past
posts) or the planner's aspects become prompt text goes through these functions.

Callers differ on purpose in their headings and in how a post is flattened; those differences are
named parameters here, not separate code:

- a reward model's context (`render_context`, used by the judges and scalar RMs; Best-of-N and
  PPO scoring reach it through them): "Past posts by the person asking (most relevant first):"
  or the planner's aspects, then "Question: ...";
- the Best-of-N / PPO policy prompt (`bon.policy_messages`): `numbered` posts under
  "Earlier posts by this person (most relevant first):";
- the generator and planner (`generation.format_profile`): posts with their whitespace collapsed
  (a multi-line post cannot break the numbering), empty posts skipped, a placeholder when none;
- P-GenRM's evidence (`pgenrm.render_evidence`): `numbered` posts and `bulleted` aspects under
  its own headings.

Plain Python; no Django.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prblib.registry import DEFAULT_PROFILE_K, setting_info
from prblib.errors import ModelError

RM_POSTS_HEADING = "Past posts by the person asking (most relevant first):"
PLAN_HEADING = "What this person is likely to value in an answer:"
QUESTION_LABEL = "Question: "


def numbered(texts: Iterable[str], *, flatten: bool = False, empty: str = "") -> str:
    """"1. first\\n2. second": one line per text, numbered from 1 in the order given.

    flatten=False: each text is stripped at its ends and every text is listed.
    flatten=True: each text's whitespace is collapsed to single spaces and empty texts are
    skipped (the numbers stay consecutive). `empty` is returned when no line results."""
    lines: list[str] = []
    for text in texts:
        line = " ".join(str(text).split()) if flatten else str(text).strip()
        if flatten and not line:
            continue
        lines.append(f"{len(lines) + 1}. {line}")
    return "\n".join(lines) if lines else empty


def bulleted(texts: Iterable[str]) -> str:
    """"- first\\n- second": one stripped line per text, in the order given."""
    return "\n".join(f"- {str(text).strip()}" for text in texts)


def render_context(question: str, *, setting: str, profile: Sequence[str] = (), plan: Sequence[str] = (),
                   profile_k: int = DEFAULT_PROFILE_K, keep_posts: int | None = None,
                   posts_heading: str = RM_POSTS_HEADING, plan_heading: str = PLAN_HEADING,
                   question_label: str = QUESTION_LABEL) -> str:
    """The user-turn text a reward model sees before a response.

    no_profile: the question alone. profile: the question after the top-k past posts
    (`posts_heading`, then `numbered` posts), most relevant first; with no posts, the question
    alone. plan: the question after the planner's aspects (`plan_heading`, then `bulleted`).
    `keep_posts` drops the lowest-ranked posts (when a scalar RM's context is too long); the
    question itself is never cut. ModelError for a setting the registry does not know.
    """
    setting_info(setting)
    if setting == "no_profile":
        return question
    if setting == "profile":
        posts = list(profile[:profile_k])
        if keep_posts is not None:
            posts = posts[:keep_posts]
        if not posts:
            return question
        return f"{posts_heading}\n{numbered(posts)}\n\n{question_label}{question}"
    if setting == "plan":
        return f"{plan_heading}\n{bulleted(plan)}\n\n{question_label}{question}"
    raise ModelError(f"setting {setting!r} has no rendering in render_context")
