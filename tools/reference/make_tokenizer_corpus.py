#!/usr/bin/env python3
"""Writes tests/data/tokenizer/corpus.jsonl: a fixed, varied set of strings on
which our tokenizer must give exactly llama.cpp's token ids.

The corpus is generated deterministically (fixed seed, no external data), so
re-running this script reproduces the committed file byte for byte. Each line
is {"id": N, "kind": "<category>", "text": "..."}, or, for the few byte
strings that are not valid UTF-8, {"id": N, "kind": "bytes", "hex": "..."}.

    python3 tools/reference/make_tokenizer_corpus.py [--out PATH]
"""
import argparse
import json
import os
import random

SEED = 20240611

WORDS = """the of and to in is was for on that with as by at from his her it an
be this which or are had not but were they one have all you there their been has
when who will more no if out so said what up its about into than them can only other
new some could time these two may then do first any my now such like our over man
me even most made after also did many before must through back years where much your
way well down should because each just those people how too little state good very
make world still own see men work long get here between both life being under never
day same another know while last might us great old year off come since against go
came right used take three quantum zebra jukebox fjord sphinx quiz vexing wizard
Python Rust JavaScript HTTP JSON API GPU CPU tokenizer inference kernel latency
Tokyo Zürich São Paulo Kraków naïve café résumé coöperate façade jalapeño""".split()

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'VE",
                "'M", "'LL", "'D", "'Ll", "'rE", "’s", "’ll", "'x", "''", "'"]

CODE = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }",
    "const x = await fetch(`/api/v1/items?id=${id}`).then(r => r.json());",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}",
    "SELECT name, COUNT(*) AS n FROM users WHERE age >= 18 GROUP BY name ORDER BY n DESC;",
    "<div class=\"row\"><span id='a1'>Hello &amp; welcome</span></div>",
    "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}",
    "if [ -f \"$HOME/.bashrc\" ]; then\n  source ~/.bashrc\nfi\n",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hi\")\n}\n",
    "template <typename T>\nstd::vector<T> take(const std::vector<T>& v, size_t n);",
    "x = [i**2 for i in range(100) if i % 3 == 0]  # squares\n",
    "    \n    return self._cache[key]\n\n\n",
    "a+=1;b-=2;c*=3;d/=4;e%=5;f<<=6;g>>=7;h&=8;i|=9;j^=10;",
    "regex = r'^(?P<user>[\\w.]+)@(?P<host>[\\w.-]+)$'",
    "public static void main(String[] args) throws IOException {}",
    "<?php echo htmlspecialchars($_GET['q'] ?? ''); ?>",
    "\\begin{equation} E = mc^2 \\end{equation}",
    "mov eax, [ebp+8]\nadd eax, 0x7fffffff\nret",
    "  - name: build\n    run: cmake --build build -j2\n",
]

SCRIPTS = {
    "cjk_zh": "我们今天去北京大学参观了图书馆，然后在食堂吃午饭。人工智能正在改变世界。",
    "cjk_ja": "東京は日本の首都です。ひらがなとカタカナと漢字を使います。ラーメンが好き！",
    "cjk_ko": "안녕하세요, 만나서 반갑습니다. 한국어는 한글로 씁니다.",
    "arabic": "مرحبا بالعالم، هذه جملة باللغة العربية مع أرقام ١٢٣٤ و 567.",
    "hebrew": "שלום עולם, זהו משפט בעברית.",
    "hindi": "नमस्ते दुनिया, यह हिन्दी में एक वाक्य है। संख्या ४२ है।",
    "cyrillic": "Привет, мир! Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "greek": "Γειά σου Κόσμε! Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
    "thai": "สวัสดีครับ ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ",
    "vietnamese": "Tiếng Việt có nhiều dấu thanh: à á ả ã ạ ằ ắ ẳ ẵ ặ.",
    "turkish": "İstanbul'da ılık bir gün; Iğdır'a gidiyoruz.",
    "armenian": "Բարեւ աշխարհ",
    "georgian": "გამარჯობა მსოფლიო",
    "tamil": "வணக்கம் உலகம்",
    "bengali": "হ্যালো বিশ্ব",
    "amharic": "ሰላም ልዑል",
    "mongolian": "ᠮᠣᠩᠭᠣᠯ ᠪᠢᠴᠢᠭ",
    "math": "∀x∈ℝ: x²≥0 ∧ ∑ᵢ aᵢ = ∫₀^∞ f(t) dt ≈ π ≠ ∞ ⊆ ℕ",
    "fullwidth": "ＡＢＣ１２３！？（）ｱｲｳ",
}

EMOJI = ["😀", "👍", "👍🏽", "👍🏿", "❤️", "🇺🇸", "🇯🇵", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🧑‍🤝‍🧑",
         "1️⃣", "#️⃣", "©️", "™", "🤷‍♂️", "🫠", "🫶🏼", "🦀", "🐍", "🚀✨", "😂😂😂", "🙏🏻",
         "👁️‍🗨️", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "☺", "✌︎", "🧔🏾‍♀️"]

SPECIAL_TEXT = [
    "<|im_start|>user\n", "<|im_start|>assistant\n", "<|im_start|>system\nYou are helpful.<|im_end|>\n",
    "<|im_end|>", "<|endoftext|>", "<repo_name>", "<file_sep>", "<jupyter_code>", "<empty_output>",
    "<start_of_turn>user\n", "<start_of_turn>model\n", "<end_of_turn>\n", "<bos>", "<eos>", "<pad>",
    "<unk>", "<mask>", "[multimodal]", "<start_of_image>", "<end_of_image>", "<unused0>",
    "<unused42>", "<unused6241>", "<|im_start", "im_start|>", "<start_of_turn", "<<|im_end|>>",
    "<|im_start|><|im_start|>", "<end_of_turn><eos>", "< |im_start| >", "<|IM_START|>",
    "<bos><bos>", "<start_of_turn>model\nSure!<end_of_turn>", "text<|im_end|>text",
]

# gpt-oss's harmony format (o200k_harmony special tokens), appended after the
# generated strings so that the earlier entries keep their ids.
HARMONY_TEXT = [
    "<|start|>user<|message|>What is 2+2?<|end|><|start|>assistant",
    "<|start|>assistant<|channel|>analysis<|message|>Let me think.<|end|>",
    "<|start|>assistant<|channel|>final<|message|>4<|return|>",
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    "<|message|>{\"city\": \"Paris\"}<|call|>",
    "<|start|>system<|message|>You are ChatGPT.\nReasoning: high\n\n# Valid channels: analysis, "
    "commentary, final.<|end|>",
    "<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>",
    "<|end|>", "<|message|>", "<|call|>", "<|reserved_200000|>", "<|reserved_200018|>",
    "<|reserved_201087|>", "<|reserved_201088|>", "<|endofprompt|>", "<|start|", "start|>",
    "<|end|><|end|>", "<<|message|>>", "<|call|><|return|>", "x<|channel|>y<|message|>z",
    "< |end| >", "<|END|>",
]

# Letter case, marks and slashes: where gpt-4o's pre-tokenizer (upper- then
# lower-case runs, "[\r\n/]*" after punctuation) and tiktoken's original differ.
CASE_TEXT = [
    "ÉCOLE École école", "HTTPServer XMLHttpRequest iPhone", "McDonald's DON'T don'T I'M",
    "ΑΘΗΝΑ Αθήνα αθήνα", "ПРИВЕТ Привет мир", "ǅemal ǈubljana", "Straße STRASSE",
    "ÀÉÎÕÜ àéîõü ÀéÎõÜ", "naïve café crème brûlée", "e\u0301cole E\u0301COLE", "ﬁle ﬂow",
    "हिन्दी भाषा", "ภาษาไทย", "مرحبا بالعالم", "שָׁלוֹם", "Ελληνικά ΕΛΛΗΝΙΚΆ",
    "/usr/local/bin\n", "a/b//c", "http://example.com/path?q=1&r=2", "!!/\r\n", " //\n/",
    "3rd A1B2 x86_64", "CamelCaseWord snake_case_word SCREAMING_CASE", "ÅngströmÅ",
    "ĲSSEL ĳssel", "Ǆ ǅ ǆ", "ᾈ ᾀ", "ＡＢＣ ａｂｃ", "𝐀𝐁𝐂 𝐚𝐛𝐜", "ʰʲʷ ˢ", "ä\u0308\u0308 A\u0308B",
]

WHITESPACE = [" ", "  ", "   ", "    ", "        ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n",
              "\r", " \n", "\n ", " \t ", "\t\n\t", "\u00a0", "\u3000", "\u2003", "\u2009",
              "\u202f", "\u0085", "\u2028", "\u2029", "\u000b", "\u000c", "\u1680", "\u205f",
              "\u180e", "\u200b"]

PUNCT = ["...", "!!!", "???", "?!", "--", "---", "—", "–", "…", "«»", "“”", "‘’", "()", "[]",
         "{}", "<>", "@#$%^&*", ";;", "::", "/**/", "//", "\\\\", "~~~", "|||", "+++", "===",
         "!=", "<=>", "->", "=>", "¿¡", "§¶", "°", "•", "※", "〜", "、。", "・", "＠"]

ODD_VALID = ["\ufffd", "\ufeff", "\ue000", "\U0010ffff", "\U000f0000", "\ufffe", "\uffff",
             "\x00", "\x01", "\x07", "\x1b[31m", "\x7f", "\x80", "\x9f", "\u200d", "\u200c",
             "\u2060", "\u00ad", "\U0001d400\U0001d401", "\U000e0041", "\u0301", "e\u0301",
             "a\u0308\u0304", "Z\u0351\u0352\u0353\u0354\u0355", "\u1100\u1161\u11a8",
             "\u0915\u094d\u0937", "\u2581", "\u2581\u2581x", "Ġ", "Ċ", "ĠĠ", "\u0120",
             "\U0001f1e6", "\ud7a3", "\u0378", "\U0001fae8", "\U0001fa77", "\U00031350",
             "\U0002ebf0", "\u0cf3", "\U00011f00", "\U0001e4d0",
             # new in Unicode 15/15.1, categorised by llama.cpp, unknown to PCRE2 10.42:
             # digits, letters (Kawi, CJK Ext. H/I, Cyrillic modifiers), punctuation
             "\U00011f50\U00011f59", "x\U0001d2c0\U0001d2c5y", "\U0001e4f0 1\U0001e4f9",
             ".\U00011f04\U00011f05.", " \U00031350\U00031351!", "a \U0002ebf0\U0002ebf1",
             "\U0001e030\U0001e031x", "!\U00011f43\U00011f44!", "\U00011b00\U00011b01.",
             "\U0001e4d0\U0001e4d1 \U0001e4f2"]

NUMBERS = ["0", "7", "42", "123", "1234", "12345", "123456", "1234567", "3.14159",
           "-273.15", "1e-9", "6.022e23", "1,000,000", "2024-06-11", "12:30:45", "+1 (555) 123-4567",
           "0xDEADBEEF", "0b1011", "v1.2.3", "192.168.0.1", "٣٤٥", "४२", "１２３", "²³", "½¾",
           "ⅫⅣ", "①②", "𝟙𝟚𝟛", "99.99%", "$1,234.56", "€20", "¥500", "3/4"]


# Byte strings that are not valid UTF-8 (stored as "hex", since JSON strings
# cannot hold them): stray bytes, overlong forms, truncated sequences,
# surrogates, and such bytes next to special-token text. Four-byte forms past
# U+10FFFF (e.g. F4 90 80 80) are left out: llama.cpp aborts on them ("invalid
# codepoint" escapes llama_tokenize), so there is no reference to compare with.
INVALID_UTF8_HEX = [
    "ff", "80", "bf", "c3", "fe", "61ff62", "c0af", "c1bf", "e282", "e228a1", "eda080",
    "edbfbf41", "f8888080", "f09f98", "68656c6c6f20f09f", "31ff32ff33",
    "20ff20", "e4bd41", "c3a9c3", "3c7c696d5f656e647cff3e", "3c7c696d5f656e647c3eff",
    "ff3c73746172745f6f665f7475726e3e", "0aff0a", "2020ff2020", "c0800a",
]


def rand_sentence(rng):
    n = rng.randint(3, 18)
    words = [rng.choice(WORDS) for _ in range(n)]
    if rng.random() < 0.5:
        words[0] = words[0].capitalize()
    s = " ".join(words)
    if rng.random() < 0.4:
        i = rng.randrange(len(s) + 1)
        s = s[:i] + rng.choice(CONTRACTIONS) + s[i:]
    return s + rng.choice([".", "!", "?", "", ",", ";", ":", "..."])


def rand_number(rng):
    r = rng.random()
    if r < 0.5:
        return rng.choice(NUMBERS)
    if r < 0.8:
        return str(rng.randint(0, 10 ** rng.randint(1, 30)))
    return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 60)))


# Ranges of assigned code points to sample from (letters, marks, symbols of
# many scripts, including some only recently added to Unicode).
CODEPOINT_RANGES = [
    (0x20, 0x7e), (0xa0, 0x24f), (0x250, 0x2ff), (0x300, 0x36f), (0x370, 0x3ff), (0x400, 0x52f),
    (0x530, 0x58f), (0x590, 0x5ff), (0x600, 0x6ff), (0x900, 0x97f), (0x980, 0x9ff), (0xe00, 0xe7f),
    (0x10a0, 0x10ff), (0x1100, 0x11ff), (0x1e00, 0x1fff), (0x2000, 0x206f), (0x2070, 0x209f),
    (0x20a0, 0x20cf), (0x2100, 0x214f), (0x2150, 0x218f), (0x2190, 0x22ff), (0x2460, 0x24ff),
    (0x2500, 0x27bf), (0x2e80, 0x2fdf), (0x3000, 0x30ff), (0x3130, 0x318f), (0x4e00, 0x9fff),
    (0xa000, 0xa4cf), (0xac00, 0xd7a3), (0xf900, 0xfaff), (0xfb00, 0xfdff), (0xfe30, 0xfe4f),
    (0xff00, 0xffef), (0x10000, 0x1007f), (0x10300, 0x1034f), (0x1d400, 0x1d7ff), (0x1f300, 0x1faff),
    (0x20000, 0x2a6df), (0x2b740, 0x2b81f), (0x30000, 0x3134f), (0x1e900, 0x1e95f), (0x11000, 0x1107f),
]


def rand_codepoints(rng, n):
    out = []
    for _ in range(n):
        lo, hi = rng.choice(CODEPOINT_RANGES)
        cp = rng.randint(lo, hi)
        if 0xd800 <= cp <= 0xdfff:
            cp = 0x41
        out.append(chr(cp))
    return "".join(out)


def rand_piece(rng):
    kind = rng.randrange(11)
    if kind == 0:
        return rand_sentence(rng)
    if kind == 1:
        return rng.choice(CODE)
    if kind == 2:
        text = rng.choice(list(SCRIPTS.values()))
        i = rng.randrange(len(text))
        return text[i:i + rng.randint(1, 40)]
    if kind == 3:
        return "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 4)))
    if kind == 4:
        return "".join(rng.choice(WHITESPACE) for _ in range(rng.randint(1, 5)))
    if kind == 5:
        return rand_number(rng)
    if kind == 6:
        return "".join(rng.choice(PUNCT) for _ in range(rng.randint(1, 4)))
    if kind == 7:
        return rng.choice(SPECIAL_TEXT)
    if kind == 8:
        return rng.choice(ODD_VALID)
    if kind == 9:
        return rand_codepoints(rng, rng.randint(1, 12))
    return rng.choice(CONTRACTIONS)


def generate():
    rng = random.Random(SEED)
    out = []

    def add(kind, text):
        out.append({"kind": kind, "text": text})

    # Fixed edge cases first.
    for t in ["", " ", "  ", "\n", "\t", "a", " a", "a ", " a ", "\n\na\n\n", "   leading", "trailing   ",
              "Hello world", "Hello, world!", "hello   world", "hello\n\nworld", "  \n  \n  ",
              "I'm you're we've they'll she'd it's", "IT'S WE'LL THEY'RE I'VE", "don't' 's 've",
              "'s's's", "a'sb", "The year 2024 had 366 days.", "12345678901234567890",
              " 1 22 333 4444 55555", "3.14 and 2.71", "x\u00a0y", "x\u3000y", "end.\u2029next"]:
        add("edge", t)
    for t in SPECIAL_TEXT:
        add("special", t)
        add("special", "Hello " + t + " world")
        add("special", t + t)
    for h in INVALID_UTF8_HEX:
        out.append({"kind": "bytes", "hex": h})
    for t in ODD_VALID:
        add("odd", t)
        add("odd", "ab" + t + "cd")
        add("odd", " " + t + " ")
    for t in WHITESPACE:
        add("ws", t)
        add("ws", "word" + t + "word")
        add("ws", t * 7 + "x")
        add("ws", "x" + t * 3)
    for t in NUMBERS:
        add("number", t)
        add("number", "Total: " + t + " units")
    for t in EMOJI:
        add("emoji", t)
        add("emoji", "I love it " + t + "!")
    for name, t in SCRIPTS.items():
        add("script:" + name, t)
    for t in CODE:
        add("code", t)
    for t in PUNCT:
        add("punct", t)
        add("punct", "wait" + t + "what")
    for c in CONTRACTIONS:
        add("contraction", "it" + c + " fine")
        add("contraction", "x " + c + " y")

    # Generated strings.
    for _ in range(400):
        add("sentence", rand_sentence(rng))
    for _ in range(150):
        add("number", rand_number(rng))
    for _ in range(200):
        add("codepoints", rand_codepoints(rng, rng.randint(1, 30)))
    for _ in range(120):
        n = rng.randint(1, 30)
        add("whitespace", "".join(rng.choice(WHITESPACE + ["a", "b", "."]) for _ in range(n)))
    for _ in range(120):
        add("emoji", "".join(rng.choice(EMOJI + [" ", "a", "!"]) for _ in range(rng.randint(1, 12))))
    for _ in range(700):
        n = rng.randint(1, 8)
        sep = rng.choice(["", " ", "\n", "  "])
        add("mixed", sep.join(rand_piece(rng) for _ in range(n)))
    for _ in range(60):
        add("punct", "".join(rng.choice(PUNCT + [" ", "a"]) for _ in range(rng.randint(1, 10))))
    # A few long texts.
    for _ in range(12):
        add("long", " ".join(rand_piece(rng) for _ in range(rng.randint(60, 200))))
    add("long", "a" * 3000)
    add("long", " " * 1000 + "x")
    add("long", "\n" * 700)
    add("long", "9" * 1000)
    add("long", "😀" * 300)
    add("long", "的" * 800)
    # gpt-oss's special tokens and gpt-4o's case rules (after everything else).
    for t in HARMONY_TEXT:
        add("special", t)
        add("special", "Hello " + t + " world")
    for t in CASE_TEXT:
        add("case", t)
        add("case", "Word " + t + "\n")
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default_out = os.path.join(here, "..", "..", "tests", "data", "tokenizer", "corpus.jsonl")
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=default_out)
    args = ap.parse_args()
    entries = generate()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        for i, e in enumerate(entries):
            rec = {"id": i, **e}
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print(f"wrote {len(entries)} strings to {os.path.normpath(args.out)}")


if __name__ == "__main__":
    main()
