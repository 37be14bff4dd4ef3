"""The three LaMP-QA domains, and how a subset name or category string maps onto them.

Plain Python (no Django) so the file readers can use it.
"""

import re

ARTS = "arts_entertainment"
LIFESTYLE = "lifestyle_personal_development"
SOCIETY = "society_culture"
# PersonalRewardBench-style pair-history sets
PRISM = "prism"
ARENA = "chatbot_arena"

# (value, human label, the published subset name)
DOMAINS = (
    (ARTS, "Arts & Entertainment", "Art_and_Entertainment"),
    (LIFESTYLE, "Lifestyle & Personal Development", "Lifestyle_and_Personal_Development"),
    (SOCIETY, "Society & Culture", "Society_and_Culture"),
    (PRISM, "PRISM", "PRISM"),
    (ARENA, "Chatbot Arena", "Chatbot_Arena"),
)
LAMP_QA_DOMAINS = (ARTS, LIFESTYLE, SOCIETY)
LABELS = {value: label for value, label, _ in DOMAINS}
SHORT_LABELS = {ARTS: "Arts", LIFESTYLE: "Lifestyle", SOCIETY: "Society", PRISM: "PRISM",
                ARENA: "Arena"}  # table headings
SUBSET_NAMES = {value: subset for value, _, subset in DOMAINS}
SUBSET_TO_DOMAIN = {subset: value for value, _, subset in DOMAINS}

_KEYWORDS = {
    ARTS: {"art", "arts", "entertainment"},
    LIFESTYLE: {"lifestyle", "personal", "development"},
    SOCIETY: {"society", "culture"},
    PRISM: {"prism"},
    ARENA: {"arena", "chatbot"},
}


def domain_from_label(text: str) -> str | None:
    """Map a category or subset name ("Art_and_Entertainment", "Arts & Entertainment",
    "society_culture", ...) onto a domain value; None if it names no domain or several."""
    words = set(re.findall(r"[a-z]+", text.lower()))
    hits = [domain for domain, keywords in _KEYWORDS.items() if words & keywords]
    return hits[0] if len(hits) == 1 else None
