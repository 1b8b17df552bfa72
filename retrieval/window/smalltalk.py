"""Small talk: greetings, thanks, acknowledgements and social chit-chat, in English and
Chinese. Such turns are the first to leave a full recent window and are left out of
extractive summaries; anything that asks for or carries substance is not small talk.
"""

from __future__ import annotations

import functools
import re

# A whole message that is only a greeting, thanks, farewell or acknowledgement. 嗯, 哦
# and 哈 repeat through the outer + (the separators may be empty): written 哈+ inside
# it, a run of 哈 split every way and 24 of them before a non-match took 20 s.
_PHATIC = re.compile(
    r"^\W*(?:(?:hi|hello|hey|yo|hiya|good (?:morning|afternoon|evening|night)|morning|"
    r"thanks?(?: you)?(?: so much| a lot| very much)?|thx|ty|cheers|ok(?:ay)?|cool|great|nice|"
    r"awesome|perfect|got it|sounds good|sure|no problem|np|you're welcome|welcome|bye|goodbye|"
    r"see you|see ya|take care|lol|haha+|hehe|wow|yes|yeah|yep|no|nope|alright|all right|"
    r"how are you(?: doing)?|how's it going|what's up|i'm (?:fine|good|great|ok)|"
    r"not bad|same here|me too|you too|have a (?:nice|good|great) (?:day|one|evening|weekend)|"
    r"enjoy(?: your \w+)?|bon appetit|"
    r"你好|您好|嗨|哈喽|早上好|早安|晚上好|晚安|谢谢(?:你|您)?|多谢|感谢|好的|好吧|好|嗯|哦|"
    r"哈|呵呵|没问题|不客气|再见|拜拜|回头见|收到|明白了?|知道了|是的|对|不错|太好了|辛苦了)"
    r"[\s,.!?~，。！？、…]*)+$",
    re.IGNORECASE,
)
# Social topics that make a short message chit-chat rather than a request.
_SOCIAL = re.compile(
    r"\b(?:lunch|dinner|breakfast|brunch|snack|coffee|tea break|weather|sunny|rainy|raining|"
    r"weekend|holiday|tired|sleepy|hungry|delicious|yummy|tasty|sandwich|ramen|pizza|salad|"
    r"how was your|how are you|nice day|lovely day)\b|"
    r"午饭|午餐|晚饭|晚餐|早饭|早餐|吃饭了吗|吃了吗|天气|下雨|晴天|周末|好吃|真香|困了|累了|饿了",
    re.IGNORECASE,
)
# Words of a request or of substance: never small talk.
_SUBSTANCE = re.compile(
    r"\b(?:help|explain|solve|calculate|compute|recommend|suggest|write|code|fix|homework|"
    r"question|how do|how does|how can|why|what is|what are|which|allerg\w*|never|always|"
    r"must|need|should|remember|conservation|equation|problem|book|recipe)\b|"
    r"[0-9]|帮我|解释|计算|推荐|建议|作业|问题|怎么|为什么|什么是|哪|必须|需要|记住|过敏|不要|题",
    re.IGNORECASE,
)
MAX_SMALL_TALK_CHARS = 160


def is_small_talk(text: str) -> bool:
    """True for a short message that only greets, thanks, acknowledges or chats socially."""
    stripped = text.strip()
    if not stripped or len(stripped) > MAX_SMALL_TALK_CHARS:
        return False
    return _is_short_small_talk(stripped)


@functools.lru_cache(maxsize=16_384)
def _is_short_small_talk(stripped: str) -> bool:
    """Cached (a window's turns are looked at again on every turn of the session); only
    short texts reach it, so the cache stays small."""
    if _PHATIC.match(stripped):
        return True
    return bool(_SOCIAL.search(stripped)) and not _SUBSTANCE.search(stripped)
