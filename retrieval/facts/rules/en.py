"""English first-person statements that carry key facts.

Each rule is a regular expression over one sentence with a named group `v` (the value),
and sometimes `k` (the item of the subject key, e.g. the relation in `family:wife`).
Sentences that are questions, hypotheticals or about the past are skipped before the
rules run; a value that is a pronoun ("I love it") yields nothing.
"""

from __future__ import annotations

import re

from retrieval.facts.rules.engine import Clause, Language, Rule
from retrieval.facts.rules.lexicon import (
    EN_CONDITIONS,
    EN_DEMONYMS,
    EN_DIETS,
    EN_OCCUPATIONS,
    EN_PETS,
    EN_RELATIONS,
)

# Where a value ends: punctuation, or a conjunction that starts another clause.
END = (
    r"(?=\s*(?:$|[,.;:!?()\"]|\s-\s|\s(?:and|but|so|because|since|though|although|which|"
    r"who|when|while|if|or|as|for|too|now|nowadays|already|anymore|these days|at the moment|"
    r"right now|currently|lately|recently|very much|so much|a lot|as well|haha|lol|btw|"
    r"by the way|with|whose|originally|in the (?:spring|summer|autumn|fall|winter))\b))"
)
ADVERBS = (
    r"(?:(?:really|truly|absolutely|totally|just|also|still|actually|honestly|genuinely|do|"
    r"very|definitely|seriously|kind of|kinda|sort of|currently|now|recently|severely|"
    r"deathly|quite|super|mildly)\s+)*"
)
I_AM = r"\b(?:i am|i'm|im|i've been|i have been|ive been)\s+" + ADVERBS
I_SUBJECT = r"\bi(?:'ve|\s+have)?\s+" + ADVERBS
ITEM = r"(?P<v>[^,.;:!?()\"]+?)" + END
# A list of items ("peanuts, shellfish and eggs"): taken to the end of the sentence and
# cut back to the list by _split_items.
ITEMS = r"(?P<v>[^.;:!?()\"]+)"
NAME = r"(?-i:(?P<v>[A-Z][\w'-]*(?:\s+[A-Z][\w'-]*){0,2}))" + END
NAME_ANY = r"(?P<v>[A-Za-z][\w'-]*(?-i:(?:\s+[A-Z][\w'-]*){0,2}))" + END
NUMBER_WORDS = (
    r"(?:(?:twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety)(?:[- ](?:one|two|three|"
    r"four|five|six|seven|eight|nine))?|one|two|three|four|five|six|seven|eight|nine|ten|"
    r"eleven|twelve|thirteen|fourteen|fifteen|sixteen|seventeen|eighteen|nineteen)"
)
AGE = r"(?P<v>\d{1,3}|" + NUMBER_WORDS + r")"


def _alternatives(words: frozenset[str]) -> str:
    return "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))


OCCUPATION = r"(?P<v>(?:[a-z-]+\s+){0,3}?(?:" + _alternatives(EN_OCCUPATIONS) + r")s?)(?=\b)"
RELATION = r"(?P<k>" + _alternatives(EN_RELATIONS) + r")"
PET = r"(?P<k>" + _alternatives(EN_PETS) + r")"
DIET = r"(?P<v>" + _alternatives(EN_DIETS) + r")"
CONDITION = r"(?P<v>" + _alternatives(EN_CONDITIONS) + r")"
NOT_DEMONYM = r"(?!(?:" + _alternatives(EN_DEMONYMS) + r")\b)"

CONDITION_OF = {"diabetic": "diabetes", "asthmatic": "asthma", "epileptic": "epilepsy"}

NUMBERS = {
    "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
    "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14,
    "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19,
    "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70,
    "eighty": 80, "ninety": 90,
}  # fmt: skip


def number(text: str) -> int | None:
    """Digits or English number words below 100."""
    if text.isdigit():
        return int(text)
    total = 0
    for word in re.split(r"[- ]", text.lower()):
        if word not in NUMBERS:
            return None
        total += NUMBERS[word]
    return total


def _age(value: str) -> str | None:
    years = number(value)
    return str(years) if years is not None and 0 < years < 130 else None


RULES: list[Rule] = [
    # identity
    Rule("identity", "name", r"\bmy (?:full |first )?name(?: is|'s)\s+" + NAME_ANY),
    Rule("identity", "name", r"\b(?:call me|i go by|i am called|i'm called)\s+" + NAME),
    Rule(
        "identity",
        "name",
        r"(?:^|[,.!]\s*|\b(?:hi|hello|hey)[,!]?\s+)(?:i am|i'm|im)\s+" + NOT_DEMONYM + NAME,
    ),
    Rule(
        "identity",
        "age",
        transform=_age,
        pattern=I_AM + AGE + r"(?=\s*(?:years?(?:\s+old|\s+of\s+age)?|yrs?(?:\s+old)?|y/?o)\b"
        r"|-years?-old|\s*(?:$|[,.;!]|\s(?:and|but|now|this year|today)\b))",
    ),
    Rule(
        "identity",
        "age",
        r"(?:\bi\s+|^|,\s*)(?:just |recently )?turned\s+" + AGE + r"\b",
        transform=_age,
    ),
    Rule("identity", "age", I_AM + r"an?\s+" + AGE + r"[- ]years?[- ]old\b", transform=_age),
    Rule("identity", "occupation", I_SUBJECT + r"work(?:ing)? as\s+(?:an?\s+)?" + OCCUPATION),
    Rule("identity", "occupation", I_AM + r"(?:working as\s+)?an?\s+" + OCCUPATION),
    Rule("identity", "occupation", r"\bmy (?:job|profession|occupation) is\s+(?:an?\s+)?" + ITEM),
    Rule("identity", "occupation", I_AM + r"an?\s+\d{1,3}[- ]years?[- ]old\s+" + OCCUPATION),
    Rule(
        "identity",
        "employer",
        I_SUBJECT + r"(?:work|worked|been working)(?:ing)? (?:at|for)\s+" + ITEM,
    ),
    Rule(
        "identity",
        "occupation",
        I_SUBJECT
        + r"(?:work|worked|been working)(?:ing)? (?:at|for|in)\s+[^,.;!?]*?[^,.;!?\s]\s+as\s+"
        r"(?:an?\s+)?" + OCCUPATION,
    ),
    Rule("identity", "employer", I_AM + r"employed (?:at|by)\s+" + ITEM),
    Rule(
        "identity",
        "employer",
        I_AM
        + r"an?\s+(?:[a-z-]+\s+){0,3}?(?:"
        + _alternatives(EN_OCCUPATIONS)
        + r")\s+(?:at|for)\s+"
        + ITEM,
    ),
    Rule("identity", "home", I_SUBJECT + r"(?:live|reside|am living|'m living)\s+in\s+" + ITEM),
    Rule(
        "identity",
        "home",
        r"\bi(?:'ve|\s+have)\s+" + ADVERBS + r"(?:lived|been living)\s+in\s+" + ITEM,
    ),
    Rule("identity", "home", I_AM + r"(?:living|based|settled)\s+in\s+" + ITEM),
    Rule(
        "identity",
        "home",
        r"\bi(?:'ve| have)?\s+"
        + ADVERBS
        + r"(?:moved|relocated)(?:\s+from\s+[^,.;!?]*?[^,.;!?\s])?"
        r"\s+to\s+" + ITEM,
    ),
    Rule("identity", "home", r"\bmy home is in\s+" + ITEM),
    Rule("identity", "hometown", I_AM + r"(?:originally\s+)?from\s+" + ITEM),
    Rule("identity", "hometown", I_SUBJECT + r"(?:originally\s+)?(?:come|hail) from\s+" + ITEM),
    Rule(
        "identity", "hometown", I_SUBJECT + r"(?:grew up|was born and raised|was born) in\s+" + ITEM
    ),
    # constraints
    Rule("constraint", "allergy", I_AM + r"(?:very\s+)?allergic to\s+" + ITEMS, items=True),
    Rule(
        "constraint",
        "allergy",
        I_SUBJECT + r"(?:have|'ve got|got) an? allergy to\s+" + ITEMS,
        items=True,
    ),
    Rule(
        "constraint",
        "allergy",
        I_SUBJECT + r"(?:have|'ve got|got) (?:an?\s+)?(?:severe\s+|mild\s+|bad\s+)?"
        r"(?P<v>[a-z][a-z -]{1,30}?) allerg(?:y|ies)\b",
        items=True,
    ),
    Rule("constraint", "diet", I_AM + r"(?:a\s+|on a\s+|strictly\s+|strict\s+)?" + DIET + r"\b"),
    Rule(
        "constraint", "diet", I_SUBJECT + r"(?:eat|follow a|keep|keep a|eat only)\s+" + DIET + r"\b"
    ),
    Rule("constraint", "health", I_SUBJECT + r"(?:have|got|live with)\s+" + CONDITION + r"\b"),
    Rule(
        "constraint",
        "health",
        I_SUBJECT + r"(?:suffer from|was diagnosed with|have been diagnosed with)\s+" + ITEM,
    ),
    Rule(
        "constraint",
        "health",
        I_AM + r"(?P<v>lactose|gluten) intolerant\b",
        transform=lambda v: f"{v.lower()} intolerance",
    ),
    Rule(
        "constraint",
        "health",
        I_AM + r"(?P<v>diabetic|asthmatic|epileptic)\b",
        transform=lambda v: CONDITION_OF[v.lower()],
    ),
    Rule(
        "constraint",
        "avoid",
        I_SUBJECT
        + r"(?:don't|do not|never|can't|cannot|can not|won't|avoid eating|must not|mustn't)"
        r"\s+(?:eat|drink|touch)\s+(?:any\s+)?(?:anything (?:with|containing)\s+)?" + ITEMS,
        items=True,
    ),
    Rule("constraint", "avoid", I_SUBJECT + r"avoid\s+(?:eating\s+)?" + ITEMS, items=True),
    Rule(
        "constraint",
        "avoid",
        r"(?:^|[,;]\s*|\band\s+)(?:please\s+)?(?:always\s+)?avoid\s+(?:using\s+)?" + ITEMS,
        items=True,
    ),
    Rule(
        "constraint",
        "avoid",
        r"\b(?:please\s+)?(?:never|don't|do not|dont)\s+(?:ever\s+)?(?:suggest|recommend|offer|"
        r"give|serve|include|propose)(?:\s+me)?\s+(?:any\s+)?(?:recipes? with\s+)?"
        r"(?:anything (?:with|containing|that contains?)\s+)?" + ITEMS,
        items=True,
    ),
    Rule("constraint", "avoid", r"\bno\s+(?P<v>[a-z][a-z -]{1,30}?)\s+for me\b", items=True),
    # preferences
    Rule(
        "preference",
        "likes",
        r"\bi\s+" + ADVERBS + r"(?:love|like|enjoy|adore)\s+(?!to\b|you\b|your\b|it\b|that\b|"
        r"this\b|them\b|when\b|how\b|the idea\b)" + ITEMS,
        items=True,
    ),
    Rule("preference", "likes", I_AM + r"(?:a\s+)?(?:huge |big )?fan of\s+" + ITEMS, items=True),
    Rule(
        "preference",
        "likes",
        r"\bi(?:'m|\s+am|'ve|\s+have)?\s+"
        + ADVERBS
        + r"(?:into|passionate about|obsessed with|gotten into|got into)\s+"
        + ITEMS,
        items=True,
    ),
    Rule(
        "preference",
        "dislikes",
        I_SUBJECT
        + r"(?:hate|dislike|detest|loathe|can't stand|cannot stand|don't like|do not like|"
        r"don't enjoy|do not enjoy)\s+(?!it\b|that\b|this\b|when\b|you\b|them\b)" + ITEMS,
        items=True,
    ),
    Rule(
        "preference",
        "dislikes",
        I_AM + r"not (?:a|really a|much of a)\s+fan of\s+" + ITEM,
        items=True,
    ),
    Rule(
        "preference",
        "favorite",
        r"\bmy (?:absolute\s+|all-time\s+)?favou?rite\s+(?P<k>[a-z][a-z ]{0,25}?)\s+(?:is|are)\s+"
        + ITEM,
    ),
    # relationships
    Rule(
        "relationship",
        "family",
        r"\bmy\s+"
        + RELATION
        + r"(?:'s name is|'s called| is called| is named| goes by|,)\s+"
        + NAME,
    ),
    Rule(
        "relationship",
        "family",
        I_SUBJECT
        + r"have an?\s+(?:\d+[- ]year[- ]old\s+|little\s+|baby\s+|older\s+|younger\s+)?"
        + RELATION
        + r"\s+(?:named|called)\s+"
        + NAME,
    ),
    Rule(
        "relationship",
        "pet",
        I_SUBJECT
        + r"(?:have|own|'ve got|got|adopted) an?\s+(?:[a-z]+\s+){0,2}?"
        + PET
        + r"\s+(?:named|called)\s+"
        + NAME,
    ),
    Rule(
        "relationship",
        "pet",
        r"\bmy\s+(?:[a-z]+\s+)?"
        + PET
        + r"(?:'s name is|'s called| is called| is named|,)\s+"
        + NAME,
    ),
]

# Clause starts that make a question.
QUESTION_START = re.compile(
    r"^\s*(?:do|does|did|can|could|would|should|will|is|are|am|was|were|what|where|who|"
    r"when|why|how|which|have|has|may)\b",
    re.IGNORECASE,
)
# Words before a statement, in its clause, that make it hypothetical, past or not the
# speaker's own: "if I were vegan", "I used to live in Rome", "I wish I lived in Paris".
NOT_A_FACT = re.compile(
    r"\b(?:if|unless|wish|wished|would|wouldn't|might|maybe|perhaps|hope|hoping|imagine|"
    r"pretend|suppose|supposing|used to|thought|dream|dreamt|dreamed|planning|going to|"
    r"gonna|want to|wanna|'d|once|back when|when i was|no longer|whether|not|n't|never)\b",
    re.IGNORECASE,
)
# Somebody else's fact: "my friend is allergic", "she lives in Rome".
OTHER_PERSON = re.compile(
    r"\b(?:friend|friends|colleague|mom|mum|dad|mother|father|brother|sister|wife|husband|son|"
    r"daughter|boss|he|she|they|we|someone|somebody|people|everyone|nobody|neighbou?r)\b",
    re.IGNORECASE,
)
AFTER_NOT_A_FACT = re.compile(
    r"^\W*(?:anymore|any more|any longer|once|before|in the past|as a kid|as a child|"
    r"when i was|back then|someday|one day|next|in the future|tomorrow|soon)\b",
    re.IGNORECASE,
)

PRONOUNS = frozenset(
    [
        "it",
        "this",
        "that",
        "these",
        "those",
        "them",
        "you",
        "him",
        "her",
        "one",
        "something",
        "anything",
        "everything",
        "nothing",
        "stuff",
        "things",
        "things",
        "like",
        "that",
        "yours",
        "mine",
    ]
)
TRAILING = re.compile(
    r"(?:\s+(?:very much|so much|a lot|as well|too|though|anyway|now|at all|lately|"
    r"recently|these days|actually|really|either|honestly|haha|lol|please|originally|"
    r"for (?:a|many|several|some|\w+) (?:years?|months?|weeks?|while)|in \d{4}|"
    r"in the (?:spring|summer|autumn|fall|winter)|"
    r"since \w+|all my life|last (?:week|month|year|summer|winter|spring|fall|autumn)|"
    r"this (?:week|month|year)|yesterday|today|a (?:few|couple of) (?:days|weeks|months|years)"
    r" ago|\w+ (?:days|weeks|months|years) ago|a while ago))+$",
    re.IGNORECASE,
)
LEADING = re.compile(
    r"^(?:the|a|an|my|some|any|all|most|eating|to|obviously|definitely|probably|usually|"
    r"always|totally|absolutely|hands down|still)\s+",
    re.IGNORECASE,
)


def _skips(rule: Rule, clause: Clause) -> bool:
    before = clause.before
    if clause.is_question or QUESTION_START.match(before) or AFTER_NOT_A_FACT.match(clause.after):
        return True
    # Constraints are stated in the negative ("I don't eat pork", "never suggest pork").
    if rule.key != "avoid" and rule.category != "preference" and NOT_A_FACT.search(before):
        return True
    if (
        rule.category == "preference"
        and re.search(r"\b(?:if|wish|would|might|maybe|used to|'d|not)\b", before, re.IGNORECASE)
        and rule.key != "dislikes"
    ):
        return True
    return rule.category != "relationship" and OTHER_PERSON.search(before) is not None


def _clean(value: str) -> str | None:
    value = value.strip().strip(" .,;:!?\"'")
    previous = None
    while previous != value:
        previous = value
        value = TRAILING.sub("", value).strip()
        value = LEADING.sub("", value).strip()
    if not value or value.lower() in PRONOUNS or len(value) > 60 or len(value.split()) > 6:
        return None
    if value.lower().split()[0] in PRONOUNS:
        return None
    return value


# Where a list of items ends: the start of another clause.
LIST_END = re.compile(
    r"\s(?:but|so|because|since|though|although|which|who|when|while|if|especially|to me|"
    r"for me|with|as well|too|now|right now|at the moment|these days|anymore|btw|"
    r"by the way|in my|at all|though|in (?:any |my |the |your )?(?:recipes?|food|dishes|meals|"
    r"cooking|snacks|desserts|suggestions))\b",
    re.IGNORECASE,
)
NOT_AN_ITEM = re.compile(
    r"^(?:they|he|she|it|i|we|you|this|that|these|those|especially|seriously|just|so|please|"
    r"but|because|which|who|what|can|could|would|will|do|does|is|are|and i|or i|thanks?|"
    r"avoid|keep|make|remember|use|give|tell|let|note|bear|mind|never|don't|no)\b",
    re.IGNORECASE,
)


def _split_items(value: str) -> list[str]:
    """The items of a list, up to where the sentence goes on with something else."""
    end = LIST_END.search(value)
    if end:
        value = value[: end.start()]
    items: list[str] = []
    for segment in value.split(","):
        segment = re.sub(r"^\s*(?:and|or)\s+", "", segment.strip(), flags=re.IGNORECASE)
        if not segment or NOT_AN_ITEM.match(segment) or len(segment.split()) > 5:
            break
        items += [v for v in re.split(r"\s+(?:and|or|&|as well as)\s+|/", segment) if v.strip()]
    return items


ENGLISH = Language("en", RULES, _skips, _clean, _split_items)
