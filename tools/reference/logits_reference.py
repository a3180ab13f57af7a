#!/usr/bin/env python3
"""Reference logits and greedy continuations from llama.cpp (via llama-cpp-python).

Writes, under tests/data/logits/<model>/ (or --out):
  prompts.json      JSON array, 20 prompts (1..1000 tokens, or 1..100 with --prompts short): name, text, ids. The ids are
                    the test input: the engine is fed these exact ids, so the logits test
                    does not depend on our tokenizer.
  last_logits.f32   little-endian float32, [20][n_vocab]: llama.cpp's logits at the last
                    prompt position after one prefill of the whole prompt from an empty cache.
  greedy.json       JSON array, per prompt: 64 greedy tokens (argmax of raw logits, lowest id on a tie,
                    fed back one token per decode call, no sampler, no EOS stop) and per step
                    the gap top1 - top2 logit ("top2_gaps"), so a test can tell a near-tie
                    from a divergence.
  Consumer: tests/unit/engine_llamacpp_reference_test.cpp.
  meta.json         llama-cpp-python version, ggml commit, llama.cpp settings, CPU features,
                    ggml_flavour (avx512/avx2: the GGML build whose arithmetic the test
                    follows), the model file's name and sha256, prompt set, the date.
  prompt_logprobs.json  only with --prompt-logprobs (alone: the other files are read, not
                    written): for a few of prompts.json's prompts, llama.cpp's logits at every
                    prompt position (logits_all, one llama_decode of the whole prompt) as
                    log-softmax in float64: per position i the logprob of prompt token i + 1 and
                    the top PROMPT_LOGPROBS_TOP (id, logprob), and llama.cpp's own spread
                    there (the same logprobs with the position last in its own prefix).
                    Consumer: tests/unit/engine_prompt_logprobs_reference_test.cpp.

Deterministic: with the same llama.cpp build and CPU, a rerun gives byte-identical
prompts.json, last_logits.f32 and greedy.json (meta.json differs only in its date).

Usage: python tools/reference/logits_reference.py [--model PATH] [--out DIR] [--prompts full|short]
           [--n-greedy N] [--chat-format auto|chatml|gemma] [--prompts-only] [--prompt-logprobs]
"""

import argparse
import ctypes
import datetime
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import llama_cpp

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL_DIR = Path(os.environ.get("INFERD_MODEL_DIR", Path.home() / ".cache/inferd/models"))
DEFAULT_MODEL = DEFAULT_MODEL_DIR / "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = REPO_ROOT / "tests/data/logits"

N_GREEDY = 64

# llama.cpp settings. n_batch >= the longest prompt so that each prompt is one llama_decode
# call, which llama.cpp splits into micro-batches of n_ubatch tokens (its default 512).
# Flash attention is off: the plain softmax(QK^T)V path, with the K/V cache stored as f16.
SETTINGS = {
    "n_ctx": 2048,
    "n_batch": 2048,
    "n_ubatch": 512,
    "n_threads": 2,
    "n_threads_batch": 2,
    "type_k": "f16",
    "type_v": "f16",
    "flash_attn": "disabled",
    "n_gpu_layers": 0,
    "seed": "none (no sampler: argmax only)",
}

# --------------------------------------------------------------------------------------
# Prompt sources. Original text written for this fixture. Each prompt is built by joining
# its sources and taking the first N token ids of llama.cpp's tokenization.
# --------------------------------------------------------------------------------------

EN_LIGHTHOUSE = """The lighthouse on Gull Point had been dark for eleven years when Mara Ellison bought it at auction for less than the price of a used car. Her friends told her it was a ruin, and they were right: the iron stairs were orange with rust, the lantern room had lost half its glass to winter storms, and the keeper's cottage smelled of wet wool and mice. But on the first evening, when she climbed to the gallery and watched the tide run out across the flats, she understood why she had raised her hand at the auction without quite meaning to.

She spent the spring scraping paint. Every morning she carried a thermos of coffee and a wire brush up the one hundred and twelve steps, and every afternoon she came down with flakes of white and red stuck in her hair. The fishermen who passed in their boats began to wave. One of them, an old man named Tobias who still wore the oilskin coat his father had worn, left a bucket of mackerel on her doorstep with a note that said only: "For the keeper."

By midsummer the lantern room had new glass, and a retired electrician from the village had helped her wire a modern lamp into the old brass housing. They lit it for the first time on a calm night in August. The beam swept out over the water, slow and steady, and from the harbour came the sound of horns: every boat that was moored there, answering the light."""

EN_SCIENCE = """Bread rises because of a partnership between yeast and gluten. When flour is mixed with water, two proteins, glutenin and gliadin, link together into long elastic strands called gluten. Kneading stretches and aligns these strands until the dough can hold its shape. Meanwhile, the yeast feeds on sugars released from the starch and produces carbon dioxide and a little alcohol. The gas collects in tiny pockets, and because the gluten network is both strong and stretchy, the pockets expand instead of bursting. The dough grows.

Temperature controls the pace of all of this. Yeast is most active between about 24 and 35 degrees Celsius; colder dough rises slowly, which many bakers prefer, because a long, cool fermentation gives enzymes time to break down starches and proteins into compounds with more flavour. In the oven, the trapped gas expands rapidly in the first few minutes, a stage bakers call oven spring, until the yeast dies and the starches set into the crumb. The crust browns through the Maillard reaction, in which sugars and amino acids combine at high temperature to form hundreds of new aromatic molecules.

Salt is not only for taste. It tightens the gluten network and slows the yeast, which is why a dough made without salt rises quickly but tastes flat and spreads in the oven. A baker who understands these few mechanisms can adjust almost any recipe: more water for an open crumb, a cooler kitchen for a deeper flavour, a hotter oven for a darker crust."""

EN_ESSAY = """Most of what we call productivity advice is really advice about attention. The tools change every few years, from paper planners to task apps to calendars that schedule themselves, but the underlying problem stays the same: there are more things that could be done than there is time to do them, and the mind is poor at holding more than a few of them at once. A list is useful not because it makes us faster but because it lets us stop rehearsing what we might forget.

There is a second, quieter problem. Work that matters tends to be work that is hard to start. Writing the first paragraph of a report, opening the spreadsheet with last quarter's numbers, calling the customer who is unhappy: these tasks carry a small cost of discomfort at the beginning, and it is remarkably easy to fill an entire morning with smaller, easier tasks that feel like progress. The practical answer is usually boring. Decide the night before what the first hour will be spent on, and spend it on that before opening any messages.

Finally, rest is part of the work. People who report being most productive over long periods are rarely the ones who work the longest hours; they are the ones who protect their sleep, take real breaks, and notice when they are tired enough that more effort will only produce mistakes."""

EN_HISTORY = """For most of history, maps were drawn less to show the world as it is than to show what their makers believed about it. Medieval European world maps placed Jerusalem at the centre and filled the edges with sea monsters and imagined peoples; they were meant to teach, not to guide a traveller. Sailors of the same period, by contrast, used portolan charts: practical drawings of coastlines criss-crossed by lines of compass bearings, made by people who had actually sailed those waters.

The great difficulty for centuries was longitude. Latitude could be found from the height of the sun or the pole star, but measuring how far east or west a ship had travelled required knowing the time at a reference point while at sea. The problem was finally solved in the eighteenth century by accurate marine clocks, and maps of the oceans improved quickly once navigators could carry the time of their home port with them. Today satellites fix a position to within a few metres, yet every map still makes choices: what to include, what to leave out, and how to flatten a round planet onto a flat page."""

PY_CODE = '''import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Inventory:
    """A small in-memory inventory that can be saved to and loaded from JSON."""

    items: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, count: int = 1) -> None:
        if count <= 0:
            raise ValueError(f"count must be positive, got {count}")
        self.items[name] = self.items.get(name, 0) + count

    def remove(self, name: str, count: int = 1) -> bool:
        """Remove up to `count` units; return False if the item was missing."""
        have = self.items.get(name, 0)
        if have == 0:
            return False
        left = have - count
        if left > 0:
            self.items[name] = left
        else:
            del self.items[name]
        return True

    def total(self) -> int:
        return sum(self.items.values())

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.items, indent=2, sort_keys=True))

    @classmethod
    def load(cls, path: Path) -> "Inventory":
        return cls(items=json.loads(path.read_text()))


def merge(a: Inventory, b: Inventory) -> Inventory:
    out = Inventory(dict(a.items))
    for name, count in b.items.items():
        out.add(name, count)
    return out


if __name__ == "__main__":
    shop = Inventory()
    shop.add("apple", 12)
    shop.add("pear", 4)
    shop.remove("apple", 5)
    print(shop.total(), sorted(shop.items))
'''

PY_CODE_2 = '''def binary_search(values, target):
    """Return the index of target in the sorted list values, or -1."""
    lo, hi = 0, len(values) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if values[mid] == target:
            return mid
        if values[mid] < target:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1


def word_counts(text):
    counts = {}
    for word in text.lower().split():
        word = word.strip(".,;:!?\\"'()")
        if word:
            counts[word] = counts.get(word, 0) + 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


class LRUCache:
    def __init__(self, capacity):
        self.capacity = capacity
        self.order = []
        self.data = {}

    def get(self, key):
        if key not in self.data:
            return None
        self.order.remove(key)
        self.order.append(key)
        return self.data[key]

    def put(self, key, value):
        if key in self.data:
            self.order.remove(key)
        elif len(self.data) >= self.capacity:
            oldest = self.order.pop(0)
            del self.data[oldest]
        self.data[key] = value
        self.order.append(key)
'''

CPP_CODE = """#include <algorithm>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

// A fixed-capacity ring buffer that overwrites the oldest element when full.
template <typename T>
class RingBuffer {
 public:
  explicit RingBuffer(std::size_t capacity) : data_(capacity) {}

  void push(const T& value) {
    data_[(head_ + size_) % data_.size()] = value;
    if (size_ < data_.size()) {
      ++size_;
    } else {
      head_ = (head_ + 1) % data_.size();
    }
  }

  const T& operator[](std::size_t i) const { return data_[(head_ + i) % data_.size()]; }
  std::size_t size() const { return size_; }

 private:
  std::vector<T> data_;
  std::size_t head_ = 0;
  std::size_t size_ = 0;
};

int main() {
  RingBuffer<std::string> log(3);
  for (const char* line : {"boot", "load model", "warm up", "serve"}) {
    log.push(line);
  }
  for (std::size_t i = 0; i < log.size(); ++i) {
    std::cout << i << ": " << log[i] << "\\n";
  }
  return 0;
}
"""

FR_TEXT = """Le petit marché du samedi s'installe sur la place de l'église bien avant le lever du soleil. Les maraîchers déchargent leurs cagettes de tomates, de courgettes et de haricots verts, tandis que le fromager dispose ses tommes sur une planche de bois. Vers huit heures, les premiers clients arrivent avec leurs paniers : une vieille dame qui achète toujours deux poireaux et une botte de radis, un jeune père qui porte sa fille sur les épaules, un cuisinier du restaurant d'en face qui goûte chaque fraise avant de choisir. On parle de la pluie, du prix du beurre, du match de dimanche. À midi, tout est rangé, et il ne reste sur les pavés que quelques feuilles de salade et l'odeur du pain chaud."""

DE_TEXT = """Der Zug nach Hamburg hatte zwanzig Minuten Verspätung, und auf dem Bahnsteig standen die Reisenden dicht gedrängt unter dem schmalen Dach. Eine Frau las ein Buch, ein Student telefonierte leise mit seiner Mutter, und zwei Kinder zählten die vorbeifahrenden Güterwagen. Als der Zug endlich einfuhr, stiegen alle gleichzeitig ein, und für einen Moment schien es, als würde niemand einen Sitzplatz finden."""

ES_TEXT = """La abuela de Lucía guardaba las recetas de la familia en una caja de lata que había sido de galletas. Dentro había tarjetas escritas a mano, algunas manchadas de aceite, otras con anotaciones en los márgenes: «menos azúcar», «mejor con limón», «a Tomás no le gusta el ajo». Cada domingo, Lucía elegía una tarjeta al azar y cocinaban juntas. Así aprendió a hacer tortilla de patatas sin que se pegara a la sartén, a preparar un gazpacho que no fuera demasiado ácido y a esperar con paciencia a que el arroz absorbiera el caldo. Años después, cuando la abuela ya no estaba, Lucía abrió la caja y encontró una tarjeta que nunca había visto. No tenía receta. Solo decía: «Cocina para los que quieres, y nunca tengas prisa.»"""

MIXED_LANG = """Español: El conocimiento es como una vela; no pierde nada al encender otra.
Deutsch: Wer langsam geht, kommt auch ans Ziel, nur später und mit mehr Aussicht.
Русский: Утро было тихим, и над рекой медленно поднимался туман.
中文：今天天气很好，我们一起去公园散步吧。
日本語：雨の日には、温かいお茶を飲みながら本を読むのが好きです。
Italiano: Chi va piano va sano e va lontano.
Português: A cidade acordou devagar, com o cheiro de café nas ruas estreitas.
"""

LIST_TEXT = """Packing list for a three-day hiking trip:
1. Backpack (40 litres) with rain cover
2. Tent, sleeping bag and sleeping mat
3. Stove, one gas canister, lighter and a small pot
4. Water filter and two one-litre bottles
5. Food: oatmeal, rice, lentils, dried fruit, nuts, chocolate
6. Map, compass and a fully charged phone
7. First aid kit: plasters, bandage, painkillers, blister tape
8. Warm jacket, rain jacket, spare socks and a hat
9. Headlamp with spare batteries
10. Sunscreen, sunglasses and insect repellent
"""

RECIPE_MD = """# Lemon and herb roast chicken

## Ingredients
- 1 whole chicken, about 1.6 kg
- 2 lemons
- 4 cloves of garlic, crushed
- 1 small bunch of thyme and 2 sprigs of rosemary
- 3 tablespoons of olive oil
- 1 teaspoon of salt and freshly ground black pepper
- 800 g of small potatoes, halved

## Method
1. Take the chicken out of the fridge an hour before cooking so it reaches room temperature.
2. Heat the oven to 200 °C (180 °C fan).
3. Zest one lemon and mix the zest with the oil, garlic, chopped thyme, salt and pepper.
4. Rub the mixture all over the chicken, including under the skin of the breast.
5. Cut both lemons in half and put them inside the chicken with the rosemary.
6. Spread the potatoes in a roasting tin, set the chicken on top and roast for 1 hour 20 minutes.
7. Check that the juices run clear when the thickest part of the thigh is pierced.
8. Rest the chicken for 15 minutes under loose foil before carving.

## Notes
- Leftovers keep for three days in the fridge and make an excellent sandwich.
- For a crisper skin, pat the chicken dry and leave it uncovered in the fridge overnight.
"""

JSON_TEXT = """{
  "stations": [
    {"id": "ST-001", "name": "North Ridge", "lat": 46.5821, "lon": 8.1123, "elevation_m": 2140,
     "readings": [{"time": "2024-03-01T06:00:00Z", "temp_c": -7.4, "wind_kmh": 31, "snow_cm": 182},
                  {"time": "2024-03-01T12:00:00Z", "temp_c": -2.1, "wind_kmh": 24, "snow_cm": 181}]},
    {"id": "ST-002", "name": "Lake Shore", "lat": 46.4410, "lon": 8.0057, "elevation_m": 612,
     "readings": [{"time": "2024-03-01T06:00:00Z", "temp_c": 1.8, "wind_kmh": 9, "snow_cm": 0},
                  {"time": "2024-03-01T12:00:00Z", "temp_c": 7.3, "wind_kmh": 14, "snow_cm": 0}]},
    {"id": "ST-003", "name": "Glacier Hut", "lat": 46.6102, "lon": 8.2289, "elevation_m": 2960,
     "readings": [{"time": "2024-03-01T06:00:00Z", "temp_c": -15.9, "wind_kmh": 58, "snow_cm": 305},
                  {"time": "2024-03-01T12:00:00Z", "temp_c": -11.2, "wind_kmh": 47, "snow_cm": 309}]}
  ],
  "units": {"temp": "celsius", "wind": "km/h", "snow": "cm"},
  "source": "example data, not real measurements"
}
"""

SMOL_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chatml(messages, add_generation_prompt=True):
    """ChatML as in SmolLM2's and Qwen2.5's chat templates (<|im_start|>role\\ncontent<|im_end|>\\n)."""
    out = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in messages)
    if add_generation_prompt:
        out += "<|im_start|>assistant\n"
    return out


def gemma_turns(messages, add_generation_prompt=True):
    """The same conversation in Gemma 3's turn markers, as its chat template writes it: no system
    role (the system text opens the first user turn, followed by a blank line), "assistant" is
    "model", and no BOS text (the tokenizer adds BOS, add_bos = true)."""
    out, system = "", ""
    for role, content in messages:
        if role == "system":
            system = content + "\n\n"
            continue
        if role == "user" and system:
            content, system = system + content, ""
        out += f"<start_of_turn>{'model' if role == 'assistant' else role}\n{content}<end_of_turn>\n"
    if add_generation_prompt:
        out += "<start_of_turn>model\n"
    return out


def harmony(messages, add_generation_prompt=True):
    """gpt-oss's harmony messages as its chat template writes plain turns
    (<|start|>role<|message|>content<|end|>; a system turn as the developer's instructions is
    the template's business, here it stays a "system" message), the generation prompt
    <|start|>assistant."""
    out = "".join(f"<|start|>{role}<|message|>{content}<|end|>" for role, content in messages)
    if add_generation_prompt:
        out += "<|start|>assistant"
    return out


CHAT_FORMATS = {"chatml": chatml, "gemma": gemma_turns, "harmony": harmony}

CONV_SHORT = [("user", "How many legs has a spider?"), ("assistant", "Eight."), ("user", "An ant?")]

CONV_SYSTEM = [
    ("system", SMOL_SYSTEM),
    ("user", "I want to start running but I get out of breath after two minutes. How should I begin?"),
    ("assistant", "Start with intervals: run for one minute, then walk for two, and repeat that eight "
                  "times. Run slowly enough that you could still hold a conversation. Three sessions a "
                  "week is plenty, and each week you can add thirty seconds to the running part."),
    ("user", "What should I eat before a morning run?"),
    ("assistant", "Something small and easy to digest about an hour before: a banana, a slice of toast "
                  "with honey, or a little yoghurt. Drink a glass of water, and keep heavy, fatty food "
                  "for after the run."),
    ("user", "Do I need special shoes?"),
    ("assistant", "You do not need expensive ones, but proper running shoes help. Try a few pairs in a "
                  "shop and jog a little in each of them. Choose the pair that feels comfortable straight "
                  "away, with a thumb's width of space in front of your toes."),
    ("user", "And how do I avoid getting injured in the first month?"),
]

CONV_LONG = [
    ("system", "You are a patient tutor who explains computer science ideas with simple examples."),
    ("user", "What is a hash table?"),
    ("assistant", "A hash table stores key-value pairs so that you can find a value by its key very "
                  "quickly. It keeps an array of slots. To store a pair, it runs the key through a hash "
                  "function, which turns the key into a number, and uses that number to pick a slot. To "
                  "look the key up later, it computes the same number and goes straight to that slot, "
                  "instead of searching through every entry."),
    ("user", "What happens if two keys land in the same slot?"),
    ("assistant", "That is called a collision, and every hash table has to handle it. One common way is "
                  "chaining: each slot holds a small list, and colliding pairs are appended to it. Another "
                  "is open addressing: if a slot is taken, the table probes the next slot, or follows some "
                  "other fixed sequence, until it finds a free one. Both work well as long as the table "
                  "does not get too full, which is why tables grow and rehash their entries once the load "
                  "factor passes a threshold such as 0.75."),
    ("user", "Why is lookup said to be O(1) if collisions can happen?"),
    ("assistant", "Because it is O(1) on average, not in the worst case. With a good hash function the "
                  "keys spread evenly over the slots, and if the table keeps its load factor bounded, the "
                  "expected number of entries in any one slot is a small constant. In the worst case, "
                  "for example if every key hashed to the same slot, a lookup would have to walk through "
                  "all n entries, which is O(n). Real implementations guard against that with good hash "
                  "functions and, in some languages, randomised seeds so attackers cannot choose colliding "
                  "keys on purpose."),
    ("user", "Can you show me a tiny example in Python?"),
    ("assistant", "Sure. Python's dict is a hash table, so the simplest example is:\n\n"
                  "```python\nages = {}\nages['ada'] = 36\nages['alan'] = 41\nprint(ages['ada'])  # 36\n```\n\n"
                  "Behind the scenes, Python calls hash('ada'), reduces the result to a slot index, and "
                  "stores the pair there. When you read ages['ada'], it repeats the same steps to find it."),
    ("user", "Thanks! Now how is a binary search tree different, and when would I prefer one?"),
]

# Prompt sets: (name, exact token count, sources joined with blank lines[, more sources]). A source
# is a string, or a conversation (a list of (role, content)) written in the model's chat format.
# "More sources" are appended only where the sources give too few tokens (chat_short is exactly 32
# tokens, up to the generation prompt, with SmolLM2's vocabulary, 30 or 31 with others; Qwen's
# vocabulary packs code tighter, Gemma's is larger). They leave SmolLM2's prompts as they were.
PROMPT_SETS = {
    # 20 prompts of 1 to 1,000 tokens (6,073 in all).
    "full": [
        ("en_single_word", 1, ["Hello"]),
        ("en_fragment", 2, ["Once upon a time"]),
        ("arithmetic", 4, ["2+2=4. 3+5="]),
        ("short_question", 8, ["What is the capital city of France?"]),
        ("german_sentence", 16, [DE_TEXT]),
        ("chat_short", 32, [CONV_SHORT], ["An ant has six legs, like every insect."]),
        ("python_short", 50, [PY_CODE_2]),
        ("list", 64, [LIST_TEXT]),
        ("en_paragraph", 100, [EN_LIGHTHOUSE]),
        ("french_paragraph", 128, [FR_TEXT, DE_TEXT]),
        ("cpp_code", 200, [CPP_CODE]),
        ("chat_system_multiturn", 256, [CONV_SYSTEM],
         ["Warm up with five minutes of brisk walking, and do not add distance and speed in the same week."]),
        ("en_science", 300, [EN_SCIENCE], [EN_HISTORY]),
        ("markdown_recipe", 400, [RECIPE_MD, LIST_TEXT]),
        ("json_data", 512, [JSON_TEXT, PY_CODE_2]),
        ("spanish_then_english", 600, [ES_TEXT, EN_ESSAY, EN_SCIENCE]),
        ("python_long", 700, [PY_CODE, PY_CODE_2], [CPP_CODE]),
        ("chat_long", 800, [CONV_LONG, "A binary search tree keeps its keys in sorted order. " + EN_ESSAY],
         [EN_HISTORY]),
        ("multilingual_mix", 900, [MIXED_LANG, FR_TEXT, ES_TEXT, DE_TEXT, EN_ESSAY], [EN_HISTORY]),
        ("en_long_story_essay_history", 1000, [EN_LIGHTHOUSE, EN_ESSAY, EN_SCIENCE, EN_HISTORY]),
    ],
    # 20 prompts of 1 to 100 tokens (891 in all), the same kinds of text: for larger models,
    # whose full-set run would take our engine's test too long on a 2-core CI machine.
    "short": [
        ("en_single_word", 1, ["Hello"]),
        ("en_fragment", 2, ["Once upon a time"]),
        ("arithmetic", 4, ["2+2=4. 3+5="]),
        ("short_question", 8, ["What is the capital city of France?"]),
        ("german_sentence", 12, [DE_TEXT]),
        ("spanish_sentence", 16, [ES_TEXT]),
        ("json_data", 20, [JSON_TEXT]),
        ("chat_short", 24, [CONV_SHORT]),
        ("russian_chinese_japanese", 28, [MIXED_LANG.split("\n", 2)[2]]),
        ("python_short", 32, [PY_CODE_2]),
        ("markdown_recipe", 40, [RECIPE_MD]),
        ("cpp_code", 48, [CPP_CODE]),
        ("french_paragraph", 56, [FR_TEXT]),
        ("list", 64, [LIST_TEXT]),
        ("en_science", 72, [EN_SCIENCE]),
        ("chat_system_multiturn", 80, [CONV_SYSTEM]),
        ("python_dataclass", 88, [PY_CODE]),
        ("en_history", 96, [EN_HISTORY]),
        ("en_paragraph", 100, [EN_LIGHTHOUSE]),
        ("chat_long", 100, [CONV_LONG]),
    ],
}


def render_source(source, chat_format):
    return CHAT_FORMATS[chat_format](source) if isinstance(source, list) else source


# --------------------------------------------------------------------------------------
# Thin wrapper over llama.cpp's C API (llama_cpp low-level bindings).
# --------------------------------------------------------------------------------------

def _quiet_log(level, text, user_data):  # llama.cpp logs to stderr by default
    pass


_LOG_CB = llama_cpp.llama_log_callback(_quiet_log)


def init_backend(quiet=True):
    if quiet:
        llama_cpp.llama_log_set(_LOG_CB, ctypes.c_void_p())
    llama_cpp.llama_backend_init()


def load_model(path):
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = 0
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    return model


def new_context(model, n_ctx=2048, n_batch=2048, n_ubatch=512, n_threads=2, flash_attn=False,
                kv_type=llama_cpp.GGML_TYPE_F16):
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = n_batch
    cparams.n_ubatch = n_ubatch
    cparams.n_seq_max = 1
    cparams.n_threads = n_threads
    cparams.n_threads_batch = n_threads
    cparams.type_k = kv_type
    cparams.type_v = kv_type
    cparams.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn
                               else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    if not ctx:
        raise RuntimeError("llama.cpp could not create a context")
    return ctx


def tokenize(vocab, text, add_bos, special=True):
    data = text.encode("utf-8")
    cap = len(data) + 16
    buf = (llama_cpp.llama_token * cap)()
    n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, cap, add_bos, special)
    if n < 0:
        raise RuntimeError("tokenize buffer too small")
    return list(buf[:n])


def detokenize_bytes(vocab, ids):
    out = bytearray()
    buf = ctypes.create_string_buffer(256)
    for t in ids:
        n = llama_cpp.llama_token_to_piece(vocab, t, buf, len(buf), 0, True)
        if n < 0:
            raise RuntimeError(f"piece of token {t} longer than buffer")
        out += buf.raw[:n]
    return bytes(out)


def decode(ctx, ids, start_pos, want_logits_last=True, chunk=None):
    """Feed ids at positions start_pos.. in llama_decode calls of at most `chunk` tokens
    (default: all at once). Returns the logits of the last token as a float32 copy."""
    chunk = chunk or len(ids)
    batch = llama_cpp.llama_batch_init(chunk, 0, 1)
    try:
        for off in range(0, len(ids), chunk):
            part = ids[off:off + chunk]
            batch.n_tokens = len(part)
            for i, t in enumerate(part):
                batch.token[i] = t
                batch.pos[i] = start_pos + off + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 0
            is_last_chunk = off + chunk >= len(ids)
            if is_last_chunk and want_logits_last:
                batch.logits[len(part) - 1] = 1
            rc = llama_cpp.llama_decode(ctx, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode failed with {rc}")
    finally:
        llama_cpp.llama_batch_free(batch)
    if not want_logits_last:
        return None
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(llama_cpp.llama_get_model(ctx)))
    ptr = llama_cpp.llama_get_logits_ith(ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).astype(np.float32, copy=True)


# The prompts whose every position is scored (--prompt-logprobs): short ones of several kinds,
# so the file and the engine's test stay small; and how many alternatives each position keeps.
PROMPT_LOGPROBS_NAMES = ["en_fragment", "arithmetic", "short_question", "chat_short", "python_short", "list"]
PROMPT_LOGPROBS_TOP = 5


def all_logits(ctx, ids):
    """The logits of every position of `ids` fed from position 0 in one llama_decode call
    (logits_all), as float32 [len(ids)][n_vocab]."""
    batch = llama_cpp.llama_batch_init(len(ids), 0, 1)
    try:
        batch.n_tokens = len(ids)
        for i, t in enumerate(ids):
            batch.token[i] = t
            batch.pos[i] = i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1
        rc = llama_cpp.llama_decode(ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with {rc}")
    finally:
        llama_cpp.llama_batch_free(batch)
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(llama_cpp.llama_get_model(ctx)))
    ptr = llama_cpp.llama_get_logits(ctx)
    return np.ctypeslib.as_array(ptr, shape=(len(ids), n_vocab)).astype(np.float32, copy=True)


def log_softmax(rows):
    """Row-wise log-softmax of float64 logits [n][n_vocab]."""
    m = rows.max(axis=1, keepdims=True)
    return rows - (m + np.log(np.exp(rows - m).sum(axis=1, keepdims=True)))


def prompt_logprobs(model, prompts):
    """Per prompt of PROMPT_LOGPROBS_NAMES: the log-softmax (float64) at every position but the
    last, the logprob of the next prompt token and the top PROMPT_LOGPROBS_TOP (lowest id on ties),
    and llama.cpp's own spread there (llamacpp_spread: the largest change of those logprobs when
    the position is computed as the last token of its prefix instead)."""
    out = []
    for p in prompts:
        if p["name"] not in PROMPT_LOGPROBS_NAMES or len(p["ids"]) < 2:
            continue
        ids = p["ids"]
        ctx = new_context(model, SETTINGS["n_ctx"], SETTINGS["n_batch"], SETTINGS["n_ubatch"],
                          SETTINGS["n_threads"], flash_attn=False)
        try:
            logits = all_logits(ctx, ids).astype(np.float64)
        finally:
            llama_cpp.llama_free(ctx)
        lsm = log_softmax(logits)
        targets, tops, spreads = [], [], []
        for i in range(len(ids) - 1):
            targets.append(float(f"{lsm[i, ids[i + 1]]:.7g}"))
            order = np.lexsort((np.arange(lsm.shape[1]), -lsm[i]))[:PROMPT_LOGPROBS_TOP]
            tops.append([[int(t), float(f"{lsm[i, t]:.7g}")] for t in order])
            # llama.cpp's own spread at this position: the same logprobs computed with the
            # position as the last token of its own prefix (another batch shape, so other
            # kernels and rounding). No engine can be held closer to llama.cpp than llama.cpp
            # is to itself; the test's tolerance at the position is at least this.
            ctx = new_context(model, SETTINGS["n_ctx"], SETTINGS["n_batch"], SETTINGS["n_ubatch"],
                              SETTINGS["n_threads"], flash_attn=False)
            try:
                alone = log_softmax(decode(ctx, ids[:i + 1], 0).astype(np.float64)[None, :])[0]
            finally:
                llama_cpp.llama_free(ctx)
            checked = [ids[i + 1]] + [int(t) for t in order]
            spreads.append(float(f"{np.abs(alone[checked] - lsm[i, checked]).max():.3g}"))
        out.append({"name": p["name"], "ids": ids, "logprobs": targets, "top": tops,
                    "llamacpp_spread": spreads})
        print(f"  {p['name']:<26} {len(ids):>5} tokens scored", file=sys.stderr)
    return out


def top2(logits):
    """(top1 id, top2 id, top1 - top2). Ties go to the lowest id (np.argmax semantics)."""
    first = int(np.argmax(logits))
    rest = logits.copy()
    rest[first] = -np.inf
    second = int(np.argmax(rest))
    return first, second, float(logits[first] - logits[second])


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def build_prompts(vocab, prompt_set="full", chat_format="chatml"):
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab))
    prompts = []
    for name, n_tokens, sources, *more in PROMPT_SETS[prompt_set]:
        full = "\n\n".join(render_source(src, chat_format) for src in sources)
        ids = tokenize(vocab, full, add_bos=add_bos, special=True)
        if len(ids) < n_tokens and more:
            full = "\n\n".join(render_source(src, chat_format) for src in sources + more[0])
            ids = tokenize(vocab, full, add_bos=add_bos, special=True)
        if len(ids) < n_tokens:
            raise RuntimeError(f"prompt {name}: sources give only {len(ids)} tokens, need {n_tokens}")
        ids = ids[:n_tokens]
        # The text leaves out the BOS that tokenizing with add_bos puts back (Gemma).
        bos = llama_cpp.llama_vocab_bos(vocab)
        raw = detokenize_bytes(vocab, ids[1:] if add_bos and ids[:1] == [bos] else ids)
        text = raw.decode("utf-8", errors="replace")
        prompts.append({
            "name": name,
            "n_tokens": n_tokens,
            "text": text,
            # Cutting at a token boundary can split a UTF-8 character or a merge; this tells a
            # tokenizer test whether text -> ids round-trips exactly for this prompt.
            "text_retokenizes_to_ids": tokenize(vocab, text, add_bos=add_bos, special=True) == ids,
            "ids": ids,
        })
    return prompts, add_bos


def generate(model, prompts, n_greedy=N_GREEDY):
    last_logits = []
    greedy = []
    for p in prompts:
        ids = p["ids"]
        # A fresh context per prompt: the prefill runs from an empty KV cache.
        ctx = new_context(model, SETTINGS["n_ctx"], SETTINGS["n_batch"], SETTINGS["n_ubatch"],
                          SETTINGS["n_threads"], flash_attn=False)
        try:
            logits = decode(ctx, ids, 0)
            last_logits.append(logits)
            tokens, seconds, gaps = [], [], []
            pos = len(ids)
            for step in range(n_greedy):
                t1, t2, gap = top2(logits)
                tokens.append(t1)
                seconds.append(t2)
                gaps.append(gap)
                if step + 1 < n_greedy:
                    logits = decode(ctx, [t1], pos)
                    pos += 1
        finally:
            llama_cpp.llama_free(ctx)
        greedy.append({"name": p["name"], "tokens": tokens, "top2_gaps": gaps, "top2_tokens": seconds})
        print(f"  {p['name']:<26} {len(ids):>5} tokens  min gap {min(gaps):.4f}", file=sys.stderr)
    return np.stack(last_logits), greedy


def ggml_build_info():
    """ggml's version and commit, read from the libggml-base that llama_cpp loads from its lib/
    directory (llama-cpp-python's own build, or setup_llama_cpp_python.sh's symlinks to a native
    build of the same vendored llama.cpp). None where the symbols are absent."""
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    try:
        lib = ctypes.CDLL(str(lib_dir / "libggml-base.so"))
        lib.ggml_version.restype = ctypes.c_char_p
        lib.ggml_commit.restype = ctypes.c_char_p
        return {"ggml_version": lib.ggml_version().decode(), "ggml_commit": lib.ggml_commit().decode()}
    except (OSError, AttributeError):
        return None


def ggml_flavour(system_info):
    """Which CPU build of GGML's kernels made the data: "avx512" where llama.cpp reports
    AVX512 = 1, else "avx2". Our forward pass follows that build's arithmetic, so the test
    loads the model with LoadOptions::ggml_flavour set from this."""
    return "avx512" if "AVX512 = 1" in system_info else "avx2"


def meta_str(model, key):
    buf = ctypes.create_string_buffer(4096)
    n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode() if n >= 0 else None


# Model files -> their directory under tests/data/logits/ (the default --out; other files use
# their name without .gguf).
DATA_DIR_NAMES = {
    "SmolLM2-135M-Instruct.Q4_1.gguf": "smollm2-135m",
    "gemma-3-270m-q4_k_m.gguf": "gemma3-270m",
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf": "qwen2.5-coder-0.5b",
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf": "qwen2.5-coder-1.5b",
}


def default_out(model_path):
    return DEFAULT_OUT / DATA_DIR_NAMES.get(model_path.name, model_path.stem)


def write_prompt_logprobs(model_path, out):
    meta = json.loads((out / "meta.json").read_text())
    prompts = json.loads((out / "prompts.json").read_text())
    if meta["model_file"] != model_path.name:
        sys.exit(f"{out} holds data of {meta['model_file']}, not {model_path.name}")
    system_info = llama_cpp.llama_print_system_info().decode().strip()
    if ggml_flavour(system_info) != meta["ggml_flavour"]:
        sys.exit(f"{out} was made by an {meta['ggml_flavour']} build; this llama.cpp is {ggml_flavour(system_info)}")
    init_backend()
    model = load_model(model_path)
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    # The same build as the directory's: its first multi-token prompt's last logits, to the bit.
    stored = np.fromfile(out / "last_logits.f32", dtype="<f4").reshape(len(prompts), n_vocab)
    k = next(i for i, p in enumerate(prompts) if len(p["ids"]) > 1)
    ctx = new_context(model, SETTINGS["n_ctx"], SETTINGS["n_batch"], SETTINGS["n_ubatch"], SETTINGS["n_threads"])
    try:
        again = decode(ctx, prompts[k]["ids"], 0)
    finally:
        llama_cpp.llama_free(ctx)
    if not np.array_equal(again, stored[k]):
        sys.exit(f"this llama.cpp build does not reproduce {out}/last_logits.f32 "
                 f"(max diff {np.abs(again - stored[k]).max():.3g}): regenerate the whole directory instead")
    scored = prompt_logprobs(model, prompts)
    with open(out / "prompt_logprobs.json", "w", encoding="utf-8") as f:
        f.write("[\n")
        for i, s in enumerate(scored):
            f.write(" " + json.dumps(s) + (",\n" if i + 1 < len(scored) else "\n"))
        f.write("]\n")
    llama_cpp.llama_model_free(model)
    print(f"wrote {out / 'prompt_logprobs.json'} ({len(scored)} prompts, top {PROMPT_LOGPROBS_TOP}, "
          f"llama-cpp-python {llama_cpp.__version__}, {ggml_flavour(system_info)})", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--out", type=Path, default=None,
                    help="output directory (default tests/data/logits/<model's directory name>)")
    ap.add_argument("--prompts", choices=sorted(PROMPT_SETS), default="full",
                    help="prompt set: full (1 to 1,000 tokens) or short (1 to 100 tokens)")
    ap.add_argument("--n-greedy", type=int, default=N_GREEDY, help="greedy tokens per prompt")
    ap.add_argument("--chat-format", choices=["auto"] + sorted(CHAT_FORMATS), default="auto",
                    help="how the chat prompts are written (auto: gemma for gemma* models, harmony for "
                         "gpt-oss, else chatml)")
    ap.add_argument("--prompts-only", action="store_true",
                    help="write prompts.json only (tokenization, no inference): to check a rerun")
    ap.add_argument("--prompt-logprobs", action="store_true",
                    help="write prompt_logprobs.json only, for the prompts of the directory's prompts.json; "
                         "refused unless this llama.cpp build is the one its meta.json names (flavour) and "
                         "reproduces its last_logits.f32")
    args = ap.parse_args()
    out = args.out or default_out(args.model)
    if args.prompt_logprobs:
        write_prompt_logprobs(args.model, out)
        return

    init_backend()
    model = load_model(args.model)
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    arch = meta_str(model, "general.architecture")
    chat_format = args.chat_format
    if chat_format == "auto":
        chat_format = ("gemma" if arch and arch.startswith("gemma") else
                       "harmony" if arch == "gpt-oss" else "chatml")

    prompts, add_bos = build_prompts(vocab, args.prompts, chat_format)
    n_prompt_tokens = sum(len(p["ids"]) for p in prompts)
    out.mkdir(parents=True, exist_ok=True)
    # Schemas read by tests/unit/engine_llamacpp_reference_test.cpp: both files are JSON arrays
    # in prompt order; prompts[i]["ids"], greedy[i]["tokens"], greedy[i]["top2_gaps"].
    with open(out / "prompts.json", "w", encoding="utf-8") as f:
        f.write("[\n")
        for i, p in enumerate(prompts):
            f.write(" " + json.dumps(p, ensure_ascii=False) + (",\n" if i + 1 < len(prompts) else "\n"))
        f.write("]\n")
    if args.prompts_only:
        print(f"wrote {out / 'prompts.json'} ({n_prompt_tokens} tokens)", file=sys.stderr)
        return

    print(f"{args.model.name} ({arch}): {len(prompts)} prompts ({args.prompts} set, {n_prompt_tokens} "
          f"tokens, {chat_format} chats), {args.n_greedy} greedy tokens each", file=sys.stderr)
    logits, greedy = generate(model, prompts, args.n_greedy)
    assert logits.shape == (len(prompts), n_vocab)

    logits.astype("<f4").tofile(out / "last_logits.f32")
    with open(out / "greedy.json", "w", encoding="utf-8") as f:
        # One line per prompt keeps the file compact and diffable.
        f.write("[\n")
        for i, g in enumerate(greedy):
            g = dict(g, top2_gaps=[float(f"{x:.6g}") for x in g["top2_gaps"]])
            f.write(" " + json.dumps(g) + (",\n" if i + 1 < len(greedy) else "\n"))
        f.write("]\n")

    system_info = llama_cpp.llama_print_system_info().decode().strip()
    meta = {
        "generator": "tools/reference/logits_reference.py",
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "llama_cpp_python_version": llama_cpp.__version__,
        "ggml_build": ggml_build_info(),
        "llama_cpp_system_info": system_info,
        "ggml_flavour": ggml_flavour(system_info),
        "model_file": args.model.name,
        "model_sha256": sha256_file(args.model),
        "architecture": arch,
        "n_vocab": n_vocab,
        "n_prompts": len(prompts),
        "prompt_set": args.prompts,
        "n_prompt_tokens": n_prompt_tokens,
        "n_greedy": args.n_greedy,
        "chat_format": chat_format,
        "tokenize": {"add_bos": add_bos, "parse_special": True,
                     "how": "each prompt = first N ids of llama_tokenize(joined source text)"},
        "settings": SETTINGS,
        "prefill": "whole prompt in one llama_decode call (n_batch >= prompt), logits for the "
                   "last position only, fresh context per prompt",
        "files": {
            "prompts.json": "array: name, n_tokens, text, text_retokenizes_to_ids, ids "
                            "(ids are the test input)",
            "last_logits.f32": f"little-endian float32, shape [{len(prompts)}][{n_vocab}], row i = prompt i",
            "greedy.json": f"array: name, tokens ({args.n_greedy} greedy ids: argmax of raw logits, lowest "
                           "id on ties; step 0 from the prompt logits; each chosen token fed back "
                           "with its own llama_decode call; no EOS stop), top2_gaps (top1 - top2 "
                           "logit at each step, 6 significant digits), top2_tokens (runner-up id)",
        },
        "sha256": {name: sha256_file(out / name)
                   for name in ("prompts.json", "last_logits.f32", "greedy.json")},
    }
    if args.prompts == "short":
        meta["prompt_set_why"] = ("prompts of at most 100 tokens keep our engine's test of this model "
                                  "within its CI share (under 3 minutes at 2 threads)")
    with open(out / "meta.json", "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")

    llama_cpp.llama_model_free(model)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
