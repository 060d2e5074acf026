"""Loop or long: truncated answers of both kinds, labelled by hand, as thinking models end
them when max_tokens cuts them."""

from __future__ import annotations

import random
import time

import pytest

from agents.engine.loops import (
    _DIGITS,
    _TOKEN,
    LOOP_SHARE,
    TAIL_CHARS,
    answer_tail,
    is_loop,
    repeat_share,
    tokens_of,
)

PROSE = (
    "To find the number of lattice paths we first observe that every path consists of exactly "
    "m right steps and n up steps, so the question reduces to choosing positions. However, the "
    "constraint that the path never crosses the diagonal changes the count: by the reflection "
    "principle, each bad path can be mapped bijectively to a path ending at (n-1, m+1). "
    "Subtracting these gives the ballot numbers. Let me double-check with a small case, m = 3 "
    "and n = 2, where direct enumeration yields five admissible paths, and the formula gives "
    "C(5,2) - C(5,1) = 10 - 5 = 5, which agrees. Now for the general proof we should be careful "
    "about the boundary, since touching the diagonal is allowed but crossing it is not, which "
    "shifts the reflected endpoint by one. Another way to see it is through generating "
    "functions: let B(x) be the series whose coefficients count the walks, then B satisfies a "
    "quadratic equation whose solution involves a square root, and expanding that root with the "
    "binomial theorem recovers the closed form. I want to also verify the asymptotics, because "
    "the problem asks for the growth rate: Stirling's approximation gives roughly 4^n divided by "
    "n to the three halves times the square root of pi, so the ratio of consecutive terms tends "
    "to four. Finally, we should consider whether the weighted version in part (b) changes "
    "anything; the weights multiply along the path, so the transfer matrix has entries a and b, "
    "and the dominant eigenvalue becomes (a + b) plus a correction that depends on whether")

CODE = '''
def merge_intervals(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge overlapping intervals; the input need not be sorted."""
    if not intervals:
        return []
    intervals = sorted(intervals, key=lambda iv: iv[0])
    merged = [intervals[0]]
    for start, end in intervals[1:]:
        last_start, last_end = merged[-1]
        if start <= last_end:
            merged[-1] = (last_start, max(last_end, end))
        else:
            merged.append((start, end))
    return merged


class IntervalTree:
    def __init__(self, points: list[int]) -> None:
        self.points = sorted(set(points))
        self.size = len(self.points)
        self.tree = [0] * (4 * self.size)
        self.lazy = [0] * (4 * self.size)

    def _push(self, node: int, lo: int, hi: int) -> None:
        if self.lazy[node]:
            self.tree[node] += self.lazy[node] * (hi - lo + 1)
            if lo != hi:
                self.lazy[2 * node] += self.lazy[node]
                self.lazy[2 * node + 1] += self.lazy[node]
            self.lazy[node] = 0

    def update(self, node: int, lo: int, hi: int, left: int, right: int, value: int) -> None:
        self._push(node, lo, hi)
        if right < lo or hi < left:
            return
        if left <= lo and hi <= right:
            self.lazy[node] += value
            self._push(node, lo, hi)
            return
        mid = (lo + hi) // 2
        self.update(2 * node, lo, mid, left, right, value)
        self.update(2 * node + 1, mid + 1, hi, left, right, value)
        self.tree[node] = self.tree[2 * node] + self.tree[2 * node + 1]

    def query(self, node: int, lo: int, hi: int, left: int, right: int) -> int:
        self._push(node, lo, hi)
        if right < lo or hi < left:
            return 0
        if left <= lo and hi <= right:
            return self.tree[node]
        mid = (lo + hi) // 2
        return (self.query(2 * node, lo, mid, left, right)
                + self.query(2 * node + 1, mid + 1, hi, left, r'''

LIST = "\n".join(f"{k}. {item}" for k, item in enumerate([
    "Check the power supply: a loose connector causes intermittent resets under load.",
    "Update the BIOS to the latest stable version, since early firmware mis-reports memory.",
    "Run memtest86 for at least two passes; a single pass misses marginal DIMMs.",
    "Inspect the kernel log for machine-check exceptions with `journalctl -k | grep mce`.",
    "Reseat the GPU and confirm the PCIe link trains at x16 Gen4 using lspci -vv.",
    "Measure the temperatures under a sustained load with nvidia-smi dmon over ten minutes.",
    "Swap the NVMe drive to rule out controller timeouts that show up as I/O errors.",
    "Disable ASPM in the firmware if the link drops to Gen1 after idle periods.",
    "Compare the failing node's driver version with a healthy node's and align them.",
    "Record the ECC counters before and after the stress run to catch rising errors.",
    "Verify the NCCL topology file matches the physical layout of the NVLink bridges.",
    "Open a ticket with the vendor including the sel log and the output of dmidecode, and ask",
], 1))

GERMAN = (
    "Die Frage lässt sich am besten schrittweise beantworten. Zunächst betrachten wir die "
    "Energiebilanz des Systems: Die zugeführte Wärme teilt sich in die Änderung der inneren "
    "Energie und die vom Gas verrichtete Arbeit auf. Bei einem isobaren Prozess ist die Arbeit "
    "einfach der Druck mal der Volumenänderung, während sie bei einem isothermen Prozess durch "
    "den natürlichen Logarithmus des Volumenverhältnisses bestimmt wird. Für das ideale Gas "
    "hängt die innere Energie nur von der Temperatur ab, sodass im isothermen Fall die gesamte "
    "Wärme in Arbeit umgewandelt wird. Im zweiten Teil der Aufgabe wird nach dem Wirkungsgrad "
    "des Kreisprozesses gefragt; dazu summieren wir die Arbeit über alle vier Teilschritte und "
    "teilen durch die im heißen Reservoir aufgenommene Wärme. Es ergibt sich ein Wert, der "
    "deutlich unter dem Carnot-Wirkungsgrad liegt, was plausibel ist, weil die isochoren "
    "Schritte irreversibel Wärme mit Reservoiren unterschiedlicher Temperatur austauschen. "
    "Schließlich prüfen wir die Einheiten und stellen fest, dass")

CHINESE = (
    "首先，我们需要明确题目的条件。已知三角形的两边长分别为五和七，夹角为六十度，要求第三边的长度以及"
    "三角形的面积。根据余弦定理，第三边的平方等于两边平方和减去两边乘积的两倍再乘以夹角的余弦值，"
    "代入数据可以得到第三边约为六点二四。接下来计算面积，可以使用两边及其夹角正弦值乘积的一半，"
    "结果约为十五点一五。为了验证答案是否合理，我们再用海伦公式计算一次面积：先求半周长，然后代入公式，"
    "得到的结果与前面一致，说明计算没有错误。题目的第二问要求判断这个三角形是锐角三角形还是钝角三角形，"
    "我们只需比较最大边的平方与另外两边平方和的大小关系。由于七的平方小于另外两边平方之和，所以最大角"
    "是锐角，因此这是一个锐角三角形。最后，题目还问到外接圆的半径，根据正弦定理，半径等于任意一边除以"
    "其对角正弦值的两倍，我们选择已知夹角所对的第三边来计算，得到半径约为三点六，再检查单位和有效数字，")

SENTENCE_LOOP = PROSE[:600] + " " + (
    "Wait, let me reconsider the boundary case where the path touches the diagonal. " * 60)
PHRASE_LOOP = PROSE[:900] + " so the answer is 5, " + "so the answer is 5, " * 300
COUNTING_LOOP = PROSE[:400] + " " + " ".join(
    f"Step {k}: add {k} to the running total, giving {k * (k + 1) // 2}." for k in range(1, 200))
VARIED_LOOP = PROSE[:500] + " " + "".join(
    f"Hmm, but actually if n = {k} then the count is {k * 3}. Let me check again. "
    for k in range(3, 120))
CODE_LOOP = (CODE[:800] + "    return merged\n" * 5
             + "        self.lazy[2 * node + 1] += self.lazy[node]\n" * 150)
CHINESE_LOOP = CHINESE[:200] + "我们再检查一遍，答案是正确的。" * 150
TABLE_LOOP = "| n | value |\n|---|---|\n" + "".join(f"| {k} | 0 |\n" for k in range(1, 600))

CASES = [
    # (label, text, is a loop): labelled by hand.
    ("prose cut mid-sentence", PROSE, False),
    ("code cut mid-expression", CODE, False),
    ("numbered checklist", LIST, False),
    ("German prose", GERMAN, False),
    ("Chinese prose", CHINESE, False),
    ("short answer", "The answer is 42 because the two factors are 6 and 7, and", False),
    ("a sentence repeated", SENTENCE_LOOP, True),
    ("a short phrase repeated", PHRASE_LOOP, True),
    ("counting with numbers that change", COUNTING_LOOP, True),
    ("a doubt repeated with new numbers", VARIED_LOOP, True),
    ("one line of code repeated", CODE_LOOP, True),
    ("Chinese sentence repeated", CHINESE_LOOP, True),
    ("a table row repeated with the index growing", TABLE_LOOP, True),
]


@pytest.mark.parametrize(("text", "loop"), [(t, lp) for _, t, lp in CASES],
                         ids=[name for name, _, _ in CASES])
def test_classified_as_labelled(text: str, loop: bool) -> None:
    share = repeat_share(text)
    assert is_loop(text) is loop, f"repeat share {share:.2f} against {LOOP_SHARE}"


def test_the_table_has_both_classes_with_a_margin() -> None:
    """Neither class sits at the threshold: a small change in either would not flip it."""
    loops = [repeat_share(t) for _, t, lp in CASES if lp]
    longs = [repeat_share(t) for _, t, lp in CASES if not lp]
    assert min(loops) >= LOOP_SHARE + 0.2 and max(longs) <= LOOP_SHARE - 0.2, (loops, longs)


def test_only_the_end_counts() -> None:
    """A loop early in a long answer that went on normally is long; a normal start that ends
    in a loop is a loop."""
    assert not is_loop(SENTENCE_LOOP + " " + PROSE + " " + GERMAN + " " + PROSE[::-1])
    assert is_loop(PROSE * 1 + GERMAN + "Let me verify this once more. " * 200)


def test_bounded_by_the_tail() -> None:
    """A 2 MB answer costs what its last TAIL_CHARS cost."""
    huge = "x " * 1_000_000 + PROSE
    start = time.perf_counter()
    for _ in range(50):
        repeat_share(huge)
    per = (time.perf_counter() - start) / 50
    assert per < 0.01, f"{per * 1e3:.1f} ms per answer"
    assert repeat_share(huge) == repeat_share(huge[-TAIL_CHARS:])


def test_reasoning_judged_when_no_content() -> None:
    assert answer_tail(None, "think") == "think"
    assert answer_tail("", "think") == "think"
    assert answer_tail("answer", "think") == "answer"
    assert not is_loop(None) and not is_loop("")


def test_ascii_text_is_cut_into_the_regexs_tokens() -> None:
    """ASCII text takes a path without the regex engine (the judge runs for every truncated
    answer): the same tokens as the regex, every ASCII character and digit run included."""
    rng = random.Random(7)
    everything = [chr(c) for c in range(128)]
    common = list("ab cd xy 0123456789 ,.;:()[]_-'\"\n\t")
    for _ in range(5000):
        pool = everything if rng.random() < 0.3 else common
        text = "".join(rng.choice(pool) for _ in range(rng.randint(0, 80)))
        want = _TOKEN.findall(_DIGITS.sub("0", text))
        got = tokens_of(text)
        assert [t if isinstance(t, str) else t.decode() for t in got] == want, repr(text)


def test_the_quick_no_agrees_with_the_share_near_the_line() -> None:
    """is_loop decides most answers from word pairs alone; it must agree with the n-gram share
    everywhere, near LOOP_SHARE most of all: fresh words, then a phrase repeated, in every
    proportion (and words drawn from few, so that pairs repeat in text that is no loop)."""
    rng = random.Random(11)
    seen = {False: 0, True: 0}
    for _ in range(800):
        words = ["".join(rng.choice("abcdefghij") for _ in range(4))  # digits fold to 0
                 for _ in range(rng.choice((30, 400, 5000, 5000)))] + [".", "step 12"]
        fresh = rng.randint(0, 500)
        phrase = [rng.choice(words) for _ in range(rng.randint(2, 60))]
        looped = rng.randint(0, 500)
        text = " ".join((phrase * (looped // len(phrase) + 1))[:looped]
                        + [rng.choice(words) for _ in range(fresh)])
        expected = repeat_share(text) >= LOOP_SHARE
        assert is_loop(text) == expected, (repeat_share(text), text[:200])
        seen[expected] += 1
    assert min(seen.values()) >= 100, seen  # both sides, not one
