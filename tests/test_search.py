"""Tests of the search indices (search.py), the item store and load_indices API (search.py) and the
MiniLM encoder (encoder.py): hand-computed scores of docs/method.md section 5.2, a brute-force reference, round trips.
"""

import json
import mmap
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import search
from search import EmbeddingIndex, Hit, Item, ItemStore, PrefixIndex, load_indices, normalize

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]

# item rows: 0 Albert Einstein, 1 Albert Camus, 2 Einstein Tower, 3 Al Gore, 4 Albertina, ...
NAMES = [
    ["Albert Einstein", "Einstein", "A. Einstein"],
    ["Albert Camus"],
    ["Einstein Tower"],
    ["Al Gore", "Albert Gore"],
    ["Albertina"],
    ["New York City", "NYC", "New York"],
    ["York"],
    ["New Zealand"],
    ["Newark"],
    ["Big Tree"],
    ["Big Trees"],
]
POPULARITY = np.array([275, 100, 5, 50, 10, 500, 40, 400, 3, 7, 7], dtype=np.float32)


@pytest.fixture(scope="module")
def index():
    return PrefixIndex.build(NAMES, POPULARITY)


def test_normalize_accents_punctuation_case():
    assert normalize("Café  Müller-Straße, Ltd.!") == ["cafe", "muller-strasse", "ltd"]
    assert normalize("“Ærø” ØRESUND naïve") == ["aero", "oresund", "naive"]
    assert normalize("(U.S.)  ...  --") == ["u.s"]  # punctuation only at word ends
    assert normalize("东京 Tower") == ["东京", "tower"]  # no ASCII form: kept as is
    # as docs/method.md 5.2 says: accents go in every script, NFKD rewrites compatibility forms and Hangul
    assert normalize("Нью-Йорк Ελλάδα") == ["нью-иорк", "ελλαδα"] and normalize("ﬁ Ⅻ") == ["fi", "xii"]
    assert normalize("서울") == ["\u1109\u1165\u110b\u116e\u11af"]  # the jamo of 서 and 울
    assert normalize("  \t\n") == []


def test_normalize_drops_invisible_characters_and_unicode_punctuation_and_lowercases_after_nfkd():
    # a soft hyphen inside a word and a trailing direction mark: as found in Wikidata labels
    assert normalize("Ma\u00adrie Curie") == normalize("Marie Curie") == ["marie", "curie"]
    assert normalize("Order of Isabella the Catholic\u200e") == ["order", "of", "isabella", "the", "catholic"]
    assert normalize("zero\u200bwidth \ufeffbom") == ["zerowidth", "bom"]
    # NFKD makes capitals of some symbols: "№" -> "No", "™" -> "TM"
    assert normalize("Symphony №5") == ["symphony", "no5"] and normalize("On The Run™") == [
        "on",
        "the",
        "runtm",
    ]
    # Unicode punctuation goes at word ends like ASCII's; symbols stay
    assert normalize("「東京」 · Tom … ") == ["東京", "tom"] and normalize("°C ½") == ["°c", "1\u20442"]


def test_normalize_treats_ascii_words_alike_in_ascii_and_non_ascii_text():
    for text in ("(U.S.) $100 a+b <tag> ~x| ^_^ 'quoted'", "St. Louis, MO", "don't --- stop!"):
        assert normalize(text + " é") == normalize(text) + ["e"]


def test_an_item_is_named_by_a_wording_one_of_its_names_holds_word_by_word():
    """Every word of the wording is a word, or starts one, of the label or of one alias (as the prefix
    index matches keywords), after normalize: case, accents and punctuation do not count."""
    van_gogh = Item("Q5582", "Vincent van Gogh", ["Van Gogh"], "Dutch painter", 3.0)
    assert (
        van_gogh.named_by("Van Gogh") and van_gogh.named_by("vincent VAN gogh.") and van_gogh.named_by("Vinc")
    )
    assert not van_gogh.named_by("Theo van Gogh") and not van_gogh.named_by("Gogh museum")
    rodriguez = Item("Q1", "Iván Rodríguez", ["Pudge"], "", 1.0)
    assert rodriguez.named_by("Ivan Rodriguez") and not rodriguez.named_by(
        "Pudge Rodriguez"
    )  # one name holds all
    wales = Item("Q181", "Jimmy Wales", [], "co-founder of Wikipedia", 1.0)
    assert not wales.named_by("Jimmy Hoffa")


def test_scores_hand_computed(index):
    # "albert": exact for Einstein/Camus/Gore (-0.25 for one unmatched name word), prefix for
    # Albertina; all tie at 0.75, so popularity orders them
    assert index.search("albert", k=10) == [(0, 0.75), (1, 0.75), (3, 0.75), (4, 0.75)]
    # 2 exact keywords, no unmatched words: 2.0; Camus 1 exact - 0.5 unmatched keyword - 0.25 "camus"
    assert index.search("albert einstein", k=3) == [(0, 2.0), (1, 0.25), (3, 0.25)]
    # prefix "ein" (0.75) on "einstein"; best name of item 0 is its alias "Einstein"
    assert index.search("ein", k=2) == [(0, 0.75), (2, 0.5)]
    # "new": prefix-only for Newark (0.75, nothing unmatched), exact for "New York" (1 - 0.25)
    assert index.search("new", k=4) == [(5, 0.75), (7, 0.75), (8, 0.75)]
    assert index.search("new newark", k=2) == [(8, 1.75), (5, 0.25)]


def test_short_keywords_only_refine(index):
    # "al" alone would match Al Gore, but next to a long keyword it only adds to found names
    assert index.search("gore al", k=5) == [(3, 2.0)]
    assert index.search("gore a", k=5) == [(3, 1.75)]  # short keywords refine by prefix too
    assert index.search("a einstein", k=2) == [(0, 2.0), (2, 0.25)]  # alias "A. Einstein"
    # "yo" finds nothing itself: York (row 6) is absent, New Zealand pays for the unmatched "yo"
    assert [row for row, _ in index.search("new yo", k=10)] == [5, 7, 8]


def test_short_only_query_matches_exact_words(index):
    assert index.search("nyc", k=3) == [(5, 1.0)]
    assert index.search("al", k=5) == [(3, 0.75)]  # exact word only: not Albert..., Albertina
    assert index.search("zz", k=5) == []


def test_popularity_breaks_ties(index):
    assert index.search("big tre", k=2) == [(9, 1.75), (10, 1.75)]  # equal popularity: row order
    flipped = PrefixIndex.build(NAMES, np.where(np.arange(len(NAMES)) == 10, 8, POPULARITY))
    assert flipped.search("big tre", k=2) == [(10, 1.75), (9, 1.75)]
    assert flipped.search("big tree", k=2) == [(9, 2.0), (10, 1.75)]  # score first


@pytest.mark.parametrize("allowed", [[2, 3], np.array([2, 3, 99, -1]), range(11)])
def test_allowed_ids(index, allowed):
    expected = [hit for hit in index.search("einstein", k=10) if hit[0] in set(allowed)]
    assert index.search("einstein", k=10, allowed_ids=allowed) == expected
    assert index.search("einstein", k=10, allowed_ids=[]) == []


def test_empty_and_whitespace_queries(index):
    for query in ["", "   ", "\t\n", "?!"]:
        assert index.search(query, k=5) == []


def memory_mapped(array: np.ndarray) -> bool:
    """True if the array's memory is a file mapping, not a copy in memory."""
    while array is not None and not isinstance(array, mmap.mmap):
        array = getattr(array, "base", None)
    return array is not None


def test_prefix_save_load_round_trip_memory_mapped(index, tmp_path):
    index.save(tmp_path / "prefix")
    loaded = PrefixIndex.load(tmp_path / "prefix")
    assert memory_mapped(loaded.postings) and memory_mapped(loaded.vocab)
    assert not list(tmp_path.glob("prefix/*.pkl"))
    for query in ["albert", "new yo", "big tre", "einstein tower", "nyc"]:
        assert loaded.search(query, k=5) == index.search(query, k=5)


def reference_search(names, popularity, query, k, allowed=None):
    """docs/method.md section 5.2 written out directly, one name at a time."""
    keywords = normalize(query)
    finders = [len(kw) >= 3 for kw in keywords] if any(len(kw) >= 3 for kw in keywords) else None
    best = {}
    for item, item_names in enumerate(names):
        if allowed is not None and item not in allowed:
            continue
        for name in item_names:
            words = normalize(name)
            if not words:
                continue
            exact = [kw in words for kw in keywords]
            prefix = [any(w.startswith(kw) for w in words) for kw in keywords]
            found = any(p for p, f in zip(prefix, finders) if f) if finders else any(exact)
            if not found:
                continue
            matched = sum(any(w.startswith(kw) for kw in keywords) for w in words)
            score = sum(1.0 if e else 0.75 if p else -0.5 for e, p in zip(exact, prefix))
            score -= 0.25 * (len(words) - matched)
            best[item] = max(best.get(item, -1e9), score)
    ranked = sorted(best.items(), key=lambda kv: (-kv[1], -popularity[kv[0]], kv[0]))
    return ranked[:k]


WORDS = ["ab", "abc", "abcd", "abd", "b", "bc", "bcd", "x", "xyz", "xyzz"]


@settings(max_examples=100, deadline=None)
@given(
    names=st.lists(
        st.lists(st.lists(st.sampled_from(WORDS), min_size=1, max_size=4).map(" ".join), max_size=3),
        min_size=1,
        max_size=12,
    ),
    query=st.lists(st.sampled_from(WORDS + ["a", "bcdx"]), min_size=1, max_size=3).map(" ".join),
    data=st.data(),
)
def test_prefix_index_matches_brute_force(names, query, data):
    popularity = np.array(data.draw(st.lists(st.integers(0, 3), min_size=len(names), max_size=len(names))))
    allowed = data.draw(st.none() | st.lists(st.integers(0, len(names) - 1), max_size=4))
    index = PrefixIndex.build(names, popularity)
    expected = reference_search(names, popularity, query, 5, allowed)
    assert index.search(query, k=5, allowed_ids=allowed) == expected


@settings(max_examples=100, deadline=None)
@given(
    names=st.lists(
        st.lists(st.lists(st.sampled_from(WORDS[:6]), min_size=1, max_size=5).map(" ".join), max_size=3),
        min_size=1,
        max_size=30,
    ),
    query=st.lists(st.sampled_from(WORDS[:6] + ["a", "bcdx"]), min_size=1, max_size=3).map(" ".join),
    k=st.integers(1, 6),
    data=st.data(),
)
def test_scoring_by_tiers_of_bounds_changes_no_result(names, query, k, data):
    """Above search.TIERED_POSTINGS postings, names are scored best bound first and the rest skipped once the
    k-th best beats the next bound, and a long posting list is not read when the short ones settle the top k:
    forced on these small inputs (few words: many ties; lists of 1 to 3 postings long), the same results."""
    popularity = np.array(data.draw(st.lists(st.integers(0, 2), min_size=len(names), max_size=len(names))))
    allowed = data.draw(st.none() | st.lists(st.integers(0, len(names) - 1), max_size=6))
    index = PrefixIndex.build(names, popularity)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(search, "TIERED_POSTINGS", data.draw(st.sampled_from([0, 1, 2, 3])))
        assert index.search(query, k, allowed) == reference_search(names, popularity, query, k, allowed)


def test_a_names_group_is_its_length_less_its_most_words_of_one_three_byte_beginning():
    """ "johnson johnson" and "new newark" can have every word matched by one keyword (group 0); "new york"
    not ("new" and "yor" begin differently: one word stays unmatched); words under 3 bytes match no finder
    ("a b" has none: its group is its length)."""
    names = ["johnson johnson", "new newark", "new york", "new york city", "a b", "newark", "of the new york"]
    words = [search.normalize(name) for name in names]
    vocab = np.unique(np.array([w.encode() for name in words for w in name]))
    name_words = np.searchsorted(vocab, np.array([w.encode() for name in words for w in name]))
    lengths = np.array([len(name) for name in words])
    assert search.name_groups(vocab, name_words, lengths).tolist() == [0, 0, 1, 2, 2, 0, 3]


def test_a_long_list_is_read_best_group_first_and_stops_early(monkeypatch):
    """One keyword's postings are long (TIERED_POSTINGS 0 here) and the short ones do not settle the top k:
    its one-word names alone settle it, so its longer names are never scored; the results are the
    brute force's. An index saved without group_ptr (built before it) gives the same results."""
    names = [["Lat"], ["Lat Lat"], ["Latte"], ["Lat River"], ["Dudibu Lat"], ["Latvia North Point"]] + [
        [f"Lat Town {i}"] for i in range(40)
    ]
    popularity = np.arange(len(names), dtype=np.float32)
    index = PrefixIndex.build(names, popularity)
    scored = []
    real_score = PrefixIndex._score
    monkeypatch.setattr(
        PrefixIndex,
        "_score",
        lambda self, found, *a, **kw: scored.append(len(found)) or real_score(self, found, *a, **kw),
    )
    monkeypatch.setattr(search, "TIERED_POSTINGS", 0)
    assert index.search("lat", 2) == reference_search(names, popularity, "lat", 2)
    assert sum(scored) < len(names) / 4  # the tiers of "Lat" and "Lat Lat" (group 0) only
    for query, k in [("lat", 5), ("dudibu lat", 3), ("lat river", 4), ("latv", 2), ("lat town", 10)]:
        assert index.search(query, k) == reference_search(names, popularity, query, k)
        old = PrefixIndex({name: getattr(index, name) for name in PrefixIndex.ARRAYS if name != "group_ptr"})
        assert old.group_ptr is None and old.search(query, k) == index.search(query, k)


def bag_of_letters(texts):
    """A deterministic toy encoder: letter counts, so similar spellings have similar vectors."""
    vectors = np.zeros((len(texts), 26), dtype=np.float32)
    for i, text in enumerate(texts):
        for c in text.lower():
            if "a" <= c <= "z":
                vectors[i, ord(c) - 97] += 1
    return vectors + 1e-3


def test_embedding_index_top_k_dedup_allowed_round_trip(tmp_path):
    names = [["place of birth", "birthplace", "born in"], ["date of birth"], ["spouse"], []]
    index = EmbeddingIndex.build(names, np.array([1, 2, 3, 4]), bag_of_letters, "letters")
    hits = index.search("birthplace", k=10)
    assert [row for row, _ in hits] == [
        0,
        1,
        2,
    ]  # item 0 once (best of 3 names), item 3 has no vector
    assert hits[0][1] == pytest.approx(1.0, abs=1e-4)
    scores = [s for _, s in hits]
    assert scores == sorted(scores, reverse=True)
    assert index.search("birthplace", k=1) == hits[:1]
    assert [row for row, _ in index.search("birthplace", k=10, allowed_ids=[1, 2, 3])] == [1, 2]
    assert index.search("birthplace", k=10, allowed_ids=[3]) == []
    assert index.search("   ", k=10) == [] and index.search("", k=10) == []
    index.save(tmp_path / "emb")
    loaded = EmbeddingIndex.load(tmp_path / "emb", encoder=bag_of_letters)
    assert memory_mapped(loaded.vectors) and loaded.encoder_name == "letters"
    assert loaded.search("birthplace", k=10) == hits


def test_embedding_ranking_ignores_last_bit_differences():
    """Another CPU's kernel sums a product in another order and changes its last bits; a tie (the same name
    twice) stays a tie, decided by popularity, instead of going to whichever row rounded up."""
    index = EmbeddingIndex.build(
        [["spouse"], ["spouse"], ["date of birth"]], np.array([1, 5, 9]), bag_of_letters, "l"
    )
    assert [row for row, _ in index.search("spouse", k=2)] == [1, 0]  # tied: the more popular first
    index.vectors = index.vectors.astype(np.float64)
    index.vectors[0] *= 1 + 1e-14  # row 0's product a few float64 bits larger
    assert [row for row, _ in index.search("spouse", k=2)] == [1, 0]


def test_embedding_search_equals_float64_brute_force():
    """The float32 pass only picks candidates: the result is the float64 scores' top k (rounded to 9 decimals,
    ties by popularity, then row) over every allowed item, with many near ties and exact ties."""
    rng = np.random.default_rng(0)
    base = rng.normal(size=(40, 384))  # 40 directions; the names are small perturbations of them: near ties
    names = [[f"{i}.{j}" for j in range(rng.integers(0, 4))] for i in range(300)]
    texts = [t for item in names for t in item]
    vectors = {t: base[int(t.split(".")[0]) % 40] + rng.normal(scale=1e-5, size=384) for t in texts}
    vectors |= {"q0": base[3], "q1": base[7] + base[8]}
    encode = lambda batch: np.stack([vectors[t] for t in batch]).astype(np.float32)
    popularity = rng.integers(0, 3, size=300).astype(np.float32)  # many popularity ties too
    index = EmbeddingIndex.build(names, popularity, encode, "random")

    def brute_force(query, k, allowed):
        q = encode([query])[0].astype(np.float64)
        q /= np.linalg.norm(q)
        rows = [i for i in allowed if index.item_ptr[i + 1] > index.item_ptr[i]]
        best = {
            i: round(
                max(
                    index.vectors[j].astype(np.float64) @ q
                    for j in range(index.item_ptr[i], index.item_ptr[i + 1])
                ),
                9,
            )
            for i in rows
        }
        return sorted(best, key=lambda i: (-best[i], -popularity[i], i))[:k]

    for query in ("q0", "q1"):
        for k in (1, 5, 25):
            assert [i for i, _ in index.search(query, k)] == brute_force(query, k, range(300))
            allowed = rng.choice(300, size=120, replace=False)
            assert [i for i, _ in index.search(query, k, allowed)] == brute_force(query, k, allowed)


def test_embedding_search_keeps_items_float32_ranks_below_the_kth():
    """Two names a few float32 ulps apart: find a query whose float32 scores order them one way and whose
    float64 scores the other. The float32 pass must keep the float64 winner as a candidate (its margin),
    or the float32 rounding, which differs between CPUs, decides the top 1."""
    rng = np.random.default_rng(1)
    for _ in range(2000):  # an inversion turns up within a few dozen tries
        base = rng.normal(size=384)
        vectors = {
            "a": base + rng.normal(scale=3e-7, size=384),
            "b": base + rng.normal(scale=3e-7, size=384),
            "far": rng.normal(size=384),
            "q": base + rng.normal(scale=0.5, size=384),
        }
        encode = lambda batch: np.stack([vectors[t] for t in batch]).astype(np.float32)
        index = EmbeddingIndex.build([["a"], ["b"], ["far"]], np.zeros(3), encode, "near")
        q = encode(["q"])[0].astype(np.float64)
        q /= np.linalg.norm(q)
        in_float32 = index.vectors @ q.astype(np.float32)
        in_float64 = np.round(index.vectors.astype(np.float64) @ q, 9)
        if in_float32[0] != in_float32[1] and in_float64[0] != in_float64[1]:
            if (in_float32[0] > in_float32[1]) != (in_float64[0] > in_float64[1]):
                break
    else:
        pytest.fail("no float32/float64 inversion found")
    winner = int(in_float64[1] > in_float64[0])
    assert [row for row, _ in index.search("q", k=1)] == [winner]
    assert [row for row, _ in index.search("q", k=2)] == [winner, 1 - winner]


def test_minilm_vectors_do_not_depend_on_the_batch():
    """Encoded alone or beside longer texts (more padding), a text gets the same float32 vector, bit for bit:
    the encoder computes in float64 (in float32 the padded batch's kernels change the last bits)."""
    from llm.encoder import load_encoder

    torch.set_num_threads(1)
    texts = ["place of birth", "country of citizenship", "located in the administrative territorial entity"]
    encoder = load_encoder()
    alone = np.stack([encoder([t])[0] for t in texts])
    assert np.array_equal(alone, encoder(texts))


def test_item_store_and_load_indices(tmp_path):
    items = [
        {
            "id": f"http://ex.org/{i}",
            "label": f"Name {i}",
            "aliases": [f"alias {i}"],
            "description": "d",
            "popularity": i,
        }
        for i in range(5)
    ]
    store_dir = tmp_path / "entities" / "items"
    assert ItemStore.write(store_dir, items) == 5
    store = ItemStore(store_dir)
    assert store[3].label == "Name 3" and store.get("http://ex.org/4").aliases == ["alias 4"]
    assert list(store.rows(["http://ex.org/2", "http://nope", "http://ex.org/0"])) == [2, 0]
    assert store.get("http://nope") is None
    with pytest.raises(ValueError, match="duplicate"):
        ItemStore.write(tmp_path / "dup", items + items[:1])

    PrefixIndex.build([[it["label"]] + it["aliases"] for it in items], store.popularity).save(
        tmp_path / "entities" / "prefix"
    )
    ItemStore.write(tmp_path / "properties" / "items", [])
    PrefixIndex.build([], np.zeros(0)).save(tmp_path / "properties" / "prefix")
    (tmp_path / "manifest.json").write_text(json.dumps({"counts": {"entity": 5, "property": 0}}))
    indices = load_indices(tmp_path)
    hits = indices.search("entity", "name", k=2)
    assert hits == [Hit(**items[4], score=0.75), Hit(**items[3], score=0.75)]  # popularity ties
    assert [h.id for h in indices.search("entity", "alias", k=5, allowed_ids=["http://ex.org/1", "x"])] == [
        "http://ex.org/1"
    ]
    assert indices.search("entity", "  ", k=5) == [] and indices.search("property", "name") == []
    assert indices.item("http://ex.org/2").label == "Name 2" and "http://ex.org/2" in indices
    with pytest.raises(KeyError):
        indices.item("http://nope")
    assert indices.get("http://ex.org/2").label == "Name 2" and indices.get("http://nope") is None
    assert "http://nope" not in indices
    with pytest.raises(ValueError, match="kind"):
        indices.search("class", "name")
    with pytest.raises(FileNotFoundError, match="build_index.py"):
        load_indices(tmp_path / "missing")


def test_load_indices_warns_of_float32_encoder_vectors(tmp_path, capsys):
    # serve.py, infer.py and the agent load with load_indices: the warning is there, not only in build_index
    for sub, names in (("entities", [["Pulp Fiction"]]), ("properties", [["place of birth"]])):
        ItemStore.write(
            tmp_path / sub / "items",
            [
                {
                    "id": f"http://ex.org/{sub}",
                    "label": names[0][0],
                    "aliases": [],
                    "description": "",
                    "popularity": 1.0,
                }
            ],
        )
        PrefixIndex.build(names, np.ones(1)).save(tmp_path / sub / "prefix")
    EmbeddingIndex.build([["place of birth"]], np.ones(1), bag_of_letters, "letters").save(
        tmp_path / "properties" / "embedding"
    )
    (tmp_path / "manifest.json").write_text(json.dumps({"counts": {"entity": 1, "property": 1}}))
    load_indices(tmp_path)
    assert "warning" not in capsys.readouterr().err
    config = tmp_path / "properties" / "embedding" / "config.json"  # as built before the float64 encoder
    config.write_text(
        json.dumps({k: v for k, v in json.loads(config.read_text()).items() if k != "vectors_from"})
    )
    assert load_indices(tmp_path).default_method("property") == "embedding"
    assert "holds float32 encoder vectors" in capsys.readouterr().err


def test_search_cli(tmp_path):
    assert (
        subprocess.run([sys.executable, "search.py", "--help"], cwd=ROOT, capture_output=True).returncode == 0
    )
    result = subprocess.run(
        [sys.executable, "search.py", "--index", str(tmp_path), "--query", "x"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0 and "build_index.py" in result.stderr and "Traceback" not in result.stderr


def test_minilm_encoder_matches_recorded_reference():
    """First dimensions recorded from sentence-transformers 6.2 (SentenceTransformer(minilm_dir())
    .encode(texts, normalize_embeddings=True)); the live comparison is the slow test below."""
    from llm.encoder import load_encoder

    torch.set_num_threads(1)
    vectors = load_encoder()(["place of birth", "Café Müller"])
    reference = [
        [-0.003893, 0.080636, -0.03981, 0.031965, -0.004922, 0.033095],
        [0.024529, 0.004776, -0.03182, 0.017883, 0.006008, 0.0703],
    ]
    np.testing.assert_allclose(vectors[:, :6], reference, atol=2e-6)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-6)
    assert float(vectors[0] @ vectors[1]) == pytest.approx(0.278836, abs=1e-5)


@pytest.mark.slow
def test_bert_forward_matches_transformers():
    """Our BERT forward equals transformers' BertModel on a tiny random config (same weights)."""
    from transformers import BertConfig, BertModel

    from llm.encoder import Bert, BertArgs

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=16,
    )
    reference = BertModel(config, add_pooling_layer=False).eval()
    ours = Bert(BertArgs(**{f: getattr(config, f) for f in BertArgs.__dataclass_fields__})).eval()
    state = {k: v for k, v in reference.state_dict().items() if k != "embeddings.position_ids"}
    ours.load_state_dict(state, strict=True)
    ids = torch.randint(1, 50, (3, 7))
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5])
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask).last_hidden_state
        got = ours(ids, mask)
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_minilm_encoder_matches_sentence_transformers():
    from sentence_transformers import SentenceTransformer

    from llm.encoder import load_encoder, minilm_dir

    torch.set_num_threads(1)
    texts = ["place of birth", "born in", "Café Müller", "", "date of death " * 100]
    ours = load_encoder()(texts)
    reference = SentenceTransformer(str(minilm_dir()), device="cpu").encode(texts, normalize_embeddings=True)
    assert ours.shape == (5, 384) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, reference, atol=1e-5)
    assert ours[0] @ ours[1] > ours[0] @ ours[2]  # "born in" is nearer to "place of birth"
