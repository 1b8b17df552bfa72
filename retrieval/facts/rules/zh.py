"""Chinese first-person statements that carry key facts.

Rules read a clause-by-clause copy of the text folded to simplified characters (one
character for one, so spans map back and values keep the user's own characters).
A clause may drop its subject when the clause before it began with 我
(我原来住在北京，现在搬到上海了): rules then also match without 我.

Every list of words under a repeat (ADVERBS, _TRAILING, _LEADING) is a prefix code: no
word begins another, so a run of them splits into words one way only and a failing
match backtracks through it once. 刚刚 is 刚 twice, 但是 但 then 是, 哈哈 哈 twice: with
both spellings listed, 刚 x n splits in Fibonacci(n) ways, and 29 characters took
seconds. `tools/check_regexes.py` refuses such a list.
"""

from __future__ import annotations

import re

from retrieval.facts.rules.engine import Clause, Language, Rule
from retrieval.facts.rules.lexicon import ZH_DIETS

# Traditional characters that the rules' own words use, folded one for one.
_TRADITIONAL = str.maketrans(
    "對過歲歡討厭來這個養貓隻條愛兒媽爺親從現醫師員學護飲經沒別給薦議麼嗎幾誰壓絕極"
    "們稱歲裡裏歲為爲賣東邊還會說請萬遠燈讓頭臺灣韓國婦職業藥乾糧羅蘭華孫傷鄉長時間種"
    "喬蘋葉雞魚蝦蟹麥濕覺過敏寵飯狀齡",
    "对过岁欢讨厌来这个养猫只条爱儿妈爷亲从现医师员学护饮经没别给荐议么吗几谁压绝极"
    "们称岁里里岁为为卖东边还会说请万远灯让头台湾韩国妇职业药干粮罗兰华孙伤乡长时间种"
    "乔苹叶鸡鱼虾蟹麦湿觉过敏宠饭状龄",
)

# A first-person subject, or none when the clause before carried it.
ME = r"(?:^|(?<=[，,：:\s]))[^，,。！？!?；;：:我]{0,10}?(?:我|本人)?"
ADVERBS = (
    r"(?:现在|目前|一直|也|还|都|就|今年|已经|平时|其实|真的|非常|特别|很|超|最|本人|是|从小|"
    r"天生|有点|比较|严重|刚|才|这人|这个人|但|可是|不过|而且)*"
)
VALUE = r"(?P<v>[^，,。！？!?；;：:\s、]+?)"
ITEMS = r"(?P<v>[^，,。！？!?；;：:\s]+?)"
END = r"(?=$|[，,。！？!?；;：:\s~～…]|了|啦|呀|啊|哦|哈|呢|吧|嘛)"
NAME = r"(?P<v>[\u3400-\u9fffA-Za-z·]{1,8}?)"
NAME_END = r"(?=$|[，,。！？!?；;：:\s~～…]|了|啦|呀|啊|哦|哈|呢|吧|嘛|，|今年|是|在|住|来自|也|就)"
NUMBER = r"(?P<v>\d{1,3}|[零一二两三四五六七八九十百]{1,4})"
RELATIONS = (
    r"(?P<k>妻子|老婆|太太|爱人|丈夫|老公|先生|儿子|女儿|妈妈|母亲|爸爸|父亲|哥哥|姐姐|弟弟|妹妹|"
    r"男朋友|女朋友|男友|女友|孩子|宝宝|爷爷|奶奶|外婆|外公|姥姥|姥爷|未婚夫|未婚妻)"
)
PETS = r"(?P<k>狗狗|小狗|狗|猫咪|小猫|猫|兔子|仓鼠|鹦鹉|乌龟|金鱼|鱼|小鸟|鸟|马)"
OCCUPATION_HEADS = (
    r"(?:工程师|程序员|设计师|老师|教师|医生|护士|律师|会计|厨师|司机|警察|记者|学生|研究生|大学生|"
    r"中学生|小学生|博士生|教授|作家|演员|歌手|画家|摄影师|建筑师|销售|经理|主管|店主|老板|"
    r"公务员|编辑|翻译|药剂师|牙医|兽医|飞行员|空姐|快递员|外卖员|保安|农民|工人|电工|"
    r"木匠|裁缝|理发师|厨子|主播|博主|科学家|研究员|分析师|顾问|咨询师|心理咨询师|"
    r"自由职业者|实习生|退休教师|家庭主妇|全职妈妈|全职爸爸|产品经理|数据科学家|会计师)"
)
CONDITIONS = (
    r"(?P<v>(?:[12一二]型)?糖尿病|高血压|高血脂|哮喘|癫痫|心脏病|关节炎|痛风|抑郁症|焦虑症|"
    r"失眠|偏头痛|胃病|胃炎|肾病|贫血|湿疹|鼻炎|乳糖不耐受?|麸质不耐受?|乳糜泻|多动症|"
    r"[\u4e00-\u9fff]{1,4}(?:病|症|炎))"
)

RULES: list[Rule] = [
    Rule(
        "identity",
        "name",
        ME + ADVERBS + r"(?:的名字叫|的名字是|名字叫|名叫|叫做|叫)" + NAME + NAME_END,
    ),
    Rule("identity", "name", r"叫我" + NAME + r"(?=就(?:行|好|可以))"),
    Rule("identity", "age", ME + ADVERBS + NUMBER + r"(?:周)?岁(?!的时候|时|那年)"),
    Rule("identity", "age", ME + r"今年" + NUMBER + r"(?=了|$|[，,。！!])"),
    Rule("identity", "age", r"我(?:今年|都|已经|快)*" + NUMBER + r"(?=了)"),
    Rule(
        "identity",
        "occupation",
        ME + ADVERBS + r"(?:是|当|做)(?:一名|一个|一位|个|名|位)?(?:[^，,。！？!?\s的]{1,10}的)?"
        r"(?P<v>[^，,。！？!?\s的]{0,4}?" + OCCUPATION_HEADS + r")" + END,
    ),
    Rule("identity", "occupation", ME + ADVERBS + r"是(?:做|干)(?P<v>[\u4e00-\u9fff]{1,6}?)的"),
    Rule(
        "identity",
        "employer",
        ME
        + ADVERBS
        + r"是(?P<v>[^，,。！？!?\s的]{1,10}?)的(?:[^，,。！？!?\s的]{0,4}?)"
        + OCCUPATION_HEADS,
    ),
    Rule("identity", "occupation", r"我的(?:工作|职业)是(?:一名|一个|一位)?" + VALUE + END),
    Rule(
        "identity",
        "occupation",
        ME + ADVERBS + r"在[^，,。！？!?\s]{1,15}?(?:当|做)(?:一名|一个|一位)?"
        r"(?P<v>[\u4e00-\u9fff]{0,4}?" + OCCUPATION_HEADS + r")" + END,
    ),
    Rule(
        "identity",
        "employer",
        ME + ADVERBS + r"在(?!家)(?P<v>[^，,。！？!?\s]{1,15}?)(?:工作|上班|任职|实习|当|做)",
    ),
    Rule("identity", "home", ME + ADVERBS + r"(?:住在|定居在|定居于|住)" + VALUE + END),
    Rule(
        "identity",
        "home",
        ME
        + ADVERBS
        + r"(?:从[^，,。！？!?\s]{1,12}?)?(?:搬到|搬去|搬家到|移居到?|迁居到?)了?"
        + VALUE
        + END,
    ),
    Rule("identity", "home", r"我家(?:现在)?在" + VALUE + END),
    Rule(
        "identity", "hometown", ME + ADVERBS + r"(?:来自|出生在|出生于|生于|长大于)" + VALUE + END
    ),
    Rule("identity", "hometown", ME + ADVERBS + r"在" + VALUE + r"(?:出生|长大|土生土长)"),
    Rule(
        "identity",
        "hometown",
        ME
        + ADVERBS
        + r"是(?:土生土长的|地道的|正宗的|纯正的)?(?P<v>[\u4e00-\u9fff]{1,6}?)人"
        + END,
    ),
    Rule("identity", "hometown", r"我(?:的)?老家(?:是|在)" + VALUE + END),
    Rule("constraint", "allergy", ME + ADVERBS + r"对" + ITEMS + r"(?:严重)?过敏"),
    Rule("constraint", "allergy", ME + ADVERBS + r"(?:有)?(?P<v>[^，,。！？!?\s对有]{1,8}?)过敏"),
    Rule(
        "constraint",
        "diet",
        ME
        + ADVERBS
        + r"(?:是)?(?:一个|一名|一位)?(?P<v>"
        + "|".join(sorted(ZH_DIETS, key=len, reverse=True))
        + r")",
    ),
    Rule(
        "constraint",
        "avoid",
        ME + ADVERBS + r"(?:不|从不|从来不|不能|不可以|不敢|不会|绝不|坚决不|一点也不|一口也不)"
        r"(?:吃|喝|碰)" + ITEMS + END,
        items=True,
    ),
    Rule(
        "constraint",
        "avoid",
        r"(?:请|千万|永远|绝对|以后)?(?:不要|别|不准|不许)(?:再)?(?:给我|帮我|为我|向我)?"
        r"(?:推荐|建议|安排|提供|放|加|做|点)(?:任何)?(?:含有?|带)?"
        + ITEMS
        + r"(?:的(?:菜|东西|食物|食谱|菜谱))?"
        + END,
        items=True,
    ),
    Rule("constraint", "health", ME + ADVERBS + r"(?:有|患有|得了|患上了?|确诊了?)" + CONDITIONS),
    Rule("constraint", "health", ME + ADVERBS + r"(?P<v>乳糖不耐受?|麸质不耐受?)"),
    Rule(
        "preference",
        "likes",
        ME
        + ADVERBS
        + r"(?:喜欢|爱|热爱|喜爱|钟爱|迷上了|痴迷于?)(?!你|他|她|它|这|那|上你|的)"
        + ITEMS
        + END,
        items=True,
    ),
    Rule("preference", "likes", r"我的(?:爱好|兴趣|兴趣爱好)是" + ITEMS + END, items=True),
    Rule(
        "preference",
        "dislikes",
        ME
        + ADVERBS
        + r"(?:讨厌|不喜欢|不爱|受不了|厌恶|反感|烦|怕)(?!你|他|她|它|这|那)"
        + ITEMS
        + END,
        items=True,
    ),
    Rule(
        "preference",
        "favorite",
        r"我最(?:喜欢|爱)的(?P<k>[\u4e00-\u9fff]{1,6}?)(?:是|就是)" + VALUE + END,
    ),
    Rule(
        "relationship",
        "family",
        r"我(?:的)?" + RELATIONS + r"(?:的名字)?(?:叫|名叫|叫做|的名字是)" + NAME + NAME_END,
    ),
    Rule(
        "relationship",
        "family",
        r"我有(?:一个|一位|个)?" + RELATIONS + r"(?:，|,)?(?:叫|名叫|叫做)" + NAME + NAME_END,
    ),
    Rule(
        "relationship",
        "pet",
        r"我(?:家)?(?:的)?(?:有|养了?|养着|养的)?(?:一|两)?(?:只|条|匹)?"
        + PETS
        + r"(?:，|,)?(?:叫|名叫|叫做|的名字叫|名字叫|的名字是)"
        + NAME
        + NAME_END,
    ),
    Rule("relationship", "pet", r"(?:一|两)?(?:只|条|匹)叫" + NAME + r"的" + PETS),
]

# Words before the value (in its clause) that make the statement a question, a wish,
# a hypothetical, a past state, or somebody else's.
_NOT_A_FACT = re.compile(
    r"如果|要是|假如|假设|希望|想要|想|打算|准备|计划|以前|曾经|过去|原来|小时候|那时|梦想|梦见|"
    r"假装|可能|也许|或许|不是|没有|不再|将来|以后会|明年|下个月|会不会|是不是|是否"
)
_OTHER_PERSON = re.compile(
    r"朋友|同事|他|她|他们|我们|别人|大家|妈妈|爸爸|母亲|父亲|哥哥|姐姐|弟弟|妹妹|老公|老婆|"
    r"儿子|女儿|孩子|同学|邻居|老板"
)
_QUESTION = re.compile(r"什么|哪|谁|几|多少|怎么|吗|么|呢\s*$|是否|有没有|是不是")
_AFTER_NOT_A_FACT = re.compile(r"^[^，,。]*?(?:吗|么|的时候|那年|以前|之前)")
_NOT_A_VALUE = re.compile(r"什么|都不|没有|任何|^不")
_PRONOUNS = {
    "你",
    "他",
    "她",
    "它",
    "这",
    "那",
    "这个",
    "那个",
    "这些",
    "那些",
    "它们",
    "你们",
    "什么",
}
_TRAILING = re.compile(
    r"(?:很多年|好多年|多年|很久|好久|一段时间|几年|一年|两年|三年|半年|好几年|已经|了|啦|呀|啊|哦|"
    r"哈|呢|吧|嘛|的|一辈子|得不得了|得要命|极了|死了|透了)+$"
)
_LEADING = re.compile(r"^(?:一些|很多|各种|所有|任何|了|在|的|吃)+")


_FIRST_PERSON = re.compile(
    r"(?:^|[，,：:])\s*(?:我|本人)(?!的|们|妈|爸|家|朋友|同事|哥|姐|弟|妹|老公|老婆|儿子|女儿|孩子|"
    r"丈夫|妻子|先生|太太|爷|奶|外)"
)


def _skips(rule: Rule, clause: Clause) -> bool:
    before = clause.before
    if clause.is_question or _QUESTION.search(before) or _AFTER_NOT_A_FACT.match(clause.after):
        return True
    # A clause without 我 speaks for the user only after a clause that began with 我
    # (commands such as 不要推荐花生 speak for the user anyway).
    if (
        rule.key != "avoid"
        and "我" not in before
        and "本人" not in before
        and (rule.key == "name" or not _FIRST_PERSON.search(clause.earlier))
    ):
        return True
    if rule.key != "avoid" and rule.key != "dislikes" and _NOT_A_FACT.search(before):
        return True
    return rule.category != "relationship" and _OTHER_PERSON.search(before) is not None


def _clean(value: str) -> str | None:
    value = value.strip(" ，,。！？!?；;：:、\"'“”")
    previous = None
    while previous != value:
        previous = value
        value = _TRAILING.sub("", value)
        value = _LEADING.sub("", value)
    if not value or value in _PRONOUNS or len(value) > 20 or _NOT_A_VALUE.search(value):
        return None
    return value


def _split_items(value: str) -> list[str]:
    return [v for v in re.split(r"[、/]|和|跟|与|及|或者?|还有", value) if v.strip()]


_DIGITS = {"零": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7,
           "八": 8, "九": 9}  # fmt: skip


def chinese_number(text: str) -> int | None:
    """Digits, or Chinese numerals below 1000 (十二, 二十, 三十五, 一百零二)."""
    if text.isdigit():
        return int(text)
    total, current = 0, 0
    for char in text:
        if char in _DIGITS:
            current = _DIGITS[char]
        elif char == "十":
            total += (current or 1) * 10
            current = 0
        elif char == "百":
            total += (current or 1) * 100
            current = 0
        else:
            return None
    return total + current


def _age(value: str) -> str | None:
    years = chinese_number(value)
    return str(years) if years is not None and 0 < years < 130 else None


def _diet(value: str) -> str | None:
    return ZH_DIETS.get(value) or ZH_DIETS.get(f"吃{value}")


def _fold(text: str) -> str:
    return text.translate(_TRADITIONAL)


def _with_transforms(rules: list[Rule]) -> list[Rule]:
    transforms = {"age": _age, "diet": _diet}
    return [
        Rule(r.category, r.key, r.pattern, r.items, transforms.get(r.key, r.transform))
        for r in rules
    ]


CHINESE = Language("zh", _with_transforms(RULES), _skips, _clean, _split_items, _fold)
