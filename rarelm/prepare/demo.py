"""The built-in demo corpora: synthetic domain documents with a known glossary.

Two deterministic generators, one per language, write documents in which a
glossary of domain terms occurs with Zipf-like frequencies, from several hundred
documents for the commonest term down to 2 for the rarest:

* English clinical notes ("Assessment: bilateral nephrosclerosis."),
* Chinese financial announcements ("公司拟发行可转换质押式回购。").

Every term is bound to its own pair of context cues (a symptom and an exam
finding, or a company event and a moved indicator) that precede its first
mention, and to a treatment or purpose that introduces its second mention, so a
model can in principle predict each term from the text before it. The rarest
terms are exactly the ones a model sees too rarely to learn: the problem rarelm
measures.

    >>> docs, glossary = generate("en", n_terms=5, top_count=4, seed=0)
    >>> len(glossary), glossary[0].count >= glossary[-1].count
    (5, True)

`rarelm demo` (or `python -m rarelm.prepare.demo`) rebuilds the committed files under
data/raw/ bit for bit.
"""

from __future__ import annotations

import dataclasses
import gzip
import itertools
import random
from pathlib import Path

from rarelm import paths
from rarelm.files import atomic_file


@dataclasses.dataclass(frozen=True)
class Term:
    text: str
    count: int  # documents that mention it
    cue_a: str
    cue_b: str
    link: str  # the treatment / purpose that introduces its second mention


EN = {
    "modifiers": ["acute", "chronic", "idiopathic", "focal", "diffuse", "bilateral", "congenital",
                  "recurrent", "segmental", "nodular", "erosive", "hemorrhagic", "ischemic",
                  "obstructive", "granulomatous", "progressive", "atypical", "secondary"],
    "roots": ["cardio", "hepato", "nephro", "neuro", "gastro", "pneumo", "osteo", "dermato",
              "myelo", "encephalo", "cholangio", "pancreato", "thyro", "adreno", "lympho",
              "angio", "arthro", "chondro", "cysto", "entero", "colo", "laryngo", "myo", "oculo",
              "phlebo", "pyelo", "rhino", "spleno", "tracheo", "glomerulo", "retino", "sialo"],
    "suffixes": ["pathy", "megaly", "sclerosis", "fibrosis", "malacia", "lithiasis", "stenosis",
                 "dysplasia", "ectasia", "necrosis", "myositis", "dystrophy"],
    "cues_a": ["intermittent chest pain", "shortness of breath", "persistent cough", "night sweats",
               "abdominal pain", "nausea", "fatigue", "joint swelling", "blurred vision",
               "headache", "dizziness", "back pain", "weight loss", "fever", "palpitations",
               "leg swelling", "hoarseness", "dysphagia", "hematuria", "jaundice", "itching",
               "muscle weakness", "numbness", "tinnitus", "nosebleeds", "dry mouth",
               "frequent urination", "bone pain", "rash", "confusion"],
    "cues_b": ["an elevated troponin", "a raised creatinine", "low sodium", "high bilirubin",
               "a low platelet count", "an elevated lipase", "a raised ESR", "a positive ANA",
               "a high TSH", "low cortisol", "an elevated CRP", "low hemoglobin",
               "a raised alkaline phosphatase", "proteinuria", "a high ferritin",
               "an abnormal ECG", "a low ejection fraction", "a raised D-dimer",
               "a high white cell count", "low albumin"],
    "links": ["prednisone", "metoprolol", "furosemide", "omeprazole", "levothyroxine",
              "amoxicillin", "heparin", "atorvastatin", "lisinopril", "methotrexate",
              "ursodiol", "tamsulosin", "gabapentin", "insulin", "warfarin", "allopurinol",
              "hydroxychloroquine", "spironolactone", "azathioprine", "colchicine"],
    "first": "The patient reported {a}, and labs showed {b}. Assessment: {term}.",
    "second": "Plan: start {link} for {term} and review in {n} weeks.",
    "filler": [
        "Patient {n} is a {age}-year-old {sex} admitted to the {ward} ward.",
        "Vital signs: blood pressure {bp1}/{bp2}, heart rate {hr}, temperature {temp} C.",
        "The patient is alert and oriented, with no acute distress.",
        "Past medical history includes {hist}.",
        "No known drug allergies were recorded.",
        "The patient denies smoking and drinks alcohol occasionally.",
        "Physical examination was otherwise unremarkable.",
        "Bloods were repeated on day {day} of the admission.",
        "The family was updated on the plan of care.",
        "Medications were reconciled with the pharmacy team.",
        "The patient will be discharged home once mobilising safely.",
        "Follow up in the outpatient clinic in {n} weeks.",
        "Imaging of the chest showed no acute changes.",
        "The patient was seen by the {ward} team this morning.",
        "Oxygen saturation was {sat} percent on room air.",
    ],
    "slots": {"sex": ["man", "woman"], "hist": ["hypertension", "type 2 diabetes", "asthma",
              "hyperlipidaemia", "obesity", "depression", "osteoarthritis"],
              "ward": ["medical", "surgical", "cardiology", "renal", "respiratory", "geriatric"]},
    "join": " ",
    "distinct": "stem",
}

ZH = {
    "modifiers": ["质押式", "买断式", "可转换", "附认股权", "浮动利率", "固定利率", "资产支持", "信用联结",
                  "结构性", "永续", "次级", "累进利率", "可交换", "绿色", "跨境", "超短期",
                  "短期", "中长期", "可赎回", "可回售", "分离交易"],
    "roots": ["回购", "债券", "票据", "互换", "期权", "远期", "存单", "贷款", "信托", "收益凭证",
              "专项计划", "融资券", "中期票据", "掉期", "借贷便利", "保理", "租赁", "资产证券化", "私募债"],
    "suffixes": ["", "合约", "工具", "产品"],
    "cues_a": ["营业收入下降", "经营现金流承压", "应收账款增加", "存货大幅增长", "净利润下滑", "资本开支上升",
               "短期借款到期", "汇率波动加剧", "原材料价格上涨", "海外订单减少", "研发投入增加", "毛利率收窄",
               "市场份额扩大", "股东减持", "信用评级下调", "利率上行", "客户集中度提高", "产能利用率下降",
               "商誉减值", "政府补助减少"],
    "cues_b": ["资产负债率升至高位", "流动比率低于一", "利息保障倍数下降", "净资产收益率回落", "速动比率下降",
               "经营杠杆上升", "自由现金流为负", "融资成本上升", "存货周转天数延长", "应付账款周转放缓",
               "现金短债比下降", "权益乘数提高", "有息负债增加", "担保余额上升", "质押比例提高", "存货跌价准备增加", "汇兑损失扩大"],
    "links": ["补充流动资金", "偿还银行贷款", "项目建设", "并购重组", "研发投入", "股份回购", "债务置换",
              "营运资金周转", "产能扩张", "海外布局"],
    "first": "公司公告称，报告期内{a}，{b}，董事会决定发行{term}。",
    "second": "本次{term}募集资金将用于{link}，期限为{n}年。",
    "filler": [
        "{co}发布{year}年年度报告。", "公司实现营业收入{n}亿元，同比增长{pct}%。",
        "报告期内公司经营情况总体稳定。", "董事会审议通过了利润分配预案。", "公司主要业务未发生重大变化。",
        "独立董事对相关事项发表了同意意见。", "本公告内容真实、准确、完整。", "公司将按规定履行信息披露义务。",
        "敬请广大投资者注意投资风险。", "截至报告期末，公司总资产为{n}亿元。", "会计师事务所出具了标准无保留意见。",
        "公司{co}子公司经营正常。", "本次交易不构成重大资产重组。", "公司股票将于{day}日复牌。",
    ],
    "slots": {"co": ["华信", "东方", "中科", "海通", "国泰", "长江", "南方", "恒生", "新华", "宏达"]},
    "join": "",
    "distinct": "modifier+root",
}

SPECS = {"en": EN, "zh": ZH}


def _glossary(spec: dict, rng: random.Random, n_terms: int, top_count: int) -> list[Term]:
    combos = list(itertools.product(spec["modifiers"], spec["roots"], spec["suffixes"]))
    rng.shuffle(combos)
    sep = "" if spec["join"] == "" else " "
    texts: list[str] = []
    seen: set[str] = set()
    for mod, root, suffix in combos:
        # a key (the stem in English, modifier + root in Chinese) names one term only
        key = root + suffix if spec["distinct"] == "stem" else mod + root
        if key in seen:
            continue
        seen.add(key)
        texts.append(f"{mod}{sep}{root}{suffix}")
        if len(texts) == n_terms:
            break
    cues = list(itertools.product(spec["cues_a"], spec["cues_b"]))
    rng.shuffle(cues)
    if len(texts) < n_terms or len(cues) < n_terms:
        raise ValueError(f"the {n_terms}-term demo needs more morphemes or cues")
    return [
        Term(text, max(2, round(top_count / rank)), a, b, rng.choice(spec["links"]))
        for rank, (text, (a, b)) in enumerate(zip(texts, cues, strict=False), start=1)
    ]


def _fill(template: str, spec: dict, rng: random.Random) -> str:
    slots = {key: rng.choice(values) for key, values in spec["slots"].items()}
    numbers = {"n": rng.randint(2, 12), "age": rng.randint(18, 95), "bp1": rng.randint(100, 170),
               "bp2": rng.randint(60, 100), "hr": rng.randint(55, 120), "day": rng.randint(1, 28),
               "temp": f"{rng.uniform(36.1, 39.0):.1f}", "sat": rng.randint(88, 100),
               "year": rng.randint(2015, 2025), "pct": f"{rng.uniform(-20, 40):.1f}"}
    return template.format(**slots, **numbers)


def generate(language: str, n_terms: int = 300, top_count: int = 700, seed: int = 0,
             filler_sentences: tuple[int, int] = (10, 18)) -> tuple[list[str], list[Term]]:
    """Documents and glossary of the demo corpus in `language` ("en" or "zh")."""
    spec = SPECS[language]
    rng = random.Random(f"rarelm-demo-{language}-{seed}")
    glossary = _glossary(spec, rng, n_terms, top_count)
    mentions = [term for term in glossary for _ in range(term.count)]
    rng.shuffle(mentions)
    by_text = {t.text: t for t in glossary}
    docs = []
    while mentions:
        terms = {mentions.pop().text: None for _ in range(min(len(mentions), rng.randint(1, 3)))}
        sentences = [_fill(rng.choice(spec["filler"]), spec, rng)
                     for _ in range(rng.randint(*filler_sentences))]
        for text in terms:
            term = by_text[text]
            first = spec["first"].format(a=term.cue_a, b=term.cue_b, term=term.text)
            second = _fill(spec["second"].replace("{link}", term.link).replace("{term}", term.text),
                           spec, rng)
            at = rng.randint(1, len(sentences))
            sentences[at:at] = [first]
            sentences.insert(rng.randint(at + 1, len(sentences)), second)
        docs.append(spec["join"].join(sentences))
    return docs, glossary


def write(out_dir: str | Path = paths.RAW, **kwargs: object) -> list[Path]:
    """Write demo_{en,zh}.txt.gz (one document per line) and their glossary TSVs."""
    out_dir = Path(out_dir)
    written = []
    for language in SPECS:
        docs, glossary = generate(language, **kwargs)  # type: ignore[arg-type]
        corpus = out_dir / f"demo_{language}.txt.gz"
        with atomic_file(corpus, "wb") as raw:
            # mtime=0 and no file name in the header: the same bytes on every rebuild
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz:
                gz.write(("\n".join(docs) + "\n").encode("utf-8"))
        table = out_dir / f"demo_{language}.glossary.tsv"
        with atomic_file(table) as f:
            f.write("term\tdocuments\tcue_a\tcue_b\tlink\n")
            for t in glossary:
                f.write(f"{t.text}\t{t.count}\t{t.cue_a}\t{t.cue_b}\t{t.link}\n")
        written += [corpus, table]
    return written


if __name__ == "__main__":
    for path in write():
        print(path)
