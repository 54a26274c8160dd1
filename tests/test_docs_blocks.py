"""Every code block of README.md and docs/ says what it is, and the runner that executes them
(tests/docs_blocks.py; the pages themselves run under `pytest -m docs`, tests/test_docs_run.py) fails a
broken block: a failing command, a renamed flag, a raising Python block, a bad config key, a block that
misquotes the file it names, an unlabelled block."""

from __future__ import annotations

import pytest

from docs_blocks import PAGES, REPO, Block, DocsError, Session, blocks, check_ci_block, check_labels


@pytest.mark.parametrize("page", PAGES)
def test_every_block_says_what_it_is(page):
    found = blocks(page)
    for block in found:
        check_labels(block)
        if block.mode == "ci":
            check_ci_block(block)


def test_the_pages_are_every_page():
    assert "README.md" in PAGES and "docs/config.md" in PAGES
    assert len(PAGES) == 1 + len(list((REPO / "docs").glob("*.md")))


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    with Session(tmp_path_factory.mktemp("docs-session"), timeout=300) as s:
        yield s


def _page(text: str) -> list[Block]:
    return blocks("docs/selftest.md", text)


def test_a_page_is_a_session(session):
    page = _page("""
```bash
mkdir -p work && cd work && echo 7 > seven.txt
```

```python
value = int(open("seven.txt").read())
```

```python
assert value == 7, value
```

```bash
test -f seven.txt && esreason tasks | grep demo-add > /dev/null
```
""")
    for block in page:
        session.run(block)
    assert session.cwd.name == "work"


@pytest.mark.parametrize("text, message", [
    ("```bash\nesreason train es --no-such-flag\n```\n", "exit 2"),
    ("```bash\nfalse\necho never\n```\n", "exit 1"),
    ("```python\nraise RuntimeError('the docs lie')\n```\n", "the docs lie"),
    ("```python\nimport sys; sys.exit(3)\n```\n", "SystemExit"),
    ("```yaml\nes:\n  sigmaa: 1.0e-3\n```\n", "sigmaa"),
    ("```yaml\nes:\n  sigma: -1\n```\n", "must be > 0"),
    ("```json\n{\"a\": 1,}\n```\n", "Expecting"),
    ("```\nesreason demo\n```\n", "label it"),
    ("```bash\n# [CI parses this only: needs GPUs]\nesreason train es --config configs/demo/es.yaml --sett x=1\n```\n",
     "exit 2"),
    ("```bash\n# [CI parses this only: needs GPUs]\nesreason train es --config configs/demo/es.yaml --set es.sigmaa=1\n"
     "```\n", "sigmaa"),
    ("```bash\n# [CI parses this only: needs GPUs]\naccelerate launch -m esreason.cli train grpo --bogus\n```\n",
     "exit 2"),
    ("```bash\n# [CI runs this with --bogus-twin-flag: a short variant]\nesreason tasks\n```\n", "exit 2"),
    ("```bash\n# [CI runs these lines in .ci/run]\npip install something-else\n```\n", "not a line of .ci/run"),
    ("```python\n# examples/custom_task/reward.py\ndef digit_reward(completions, **kwargs):\n    ...\n```\n",
     "differs from it"),
    ("```python\n# [CI parses this only: needs a plugin package]\nfrom esreason import no_such_name\n```\n",
     "no_such_name"),
    ("```bash\n# [CI sometimes runs this]\nesreason tasks\n```\n", "unknown form"),
])
def test_a_broken_block_fails(session, text, message):
    with pytest.raises(DocsError, match=message):
        for block in _page(text):
            session.run(block)


def test_the_twin_and_parse_forms_reach_the_cli(session):
    twin, parse = _page(
        "```bash\n# [CI runs this with --json: a short variant]\nesreason tasks > tasks.json\n```\n\n"
        "```bash\n# [CI parses this only: needs 8 GPUs and the hub]\n"
        "esreason experiment run configs/experiments/easy.yaml\nray start --head\n```\n")
    assert (twin.mode, twin.args, twin.reason) == ("twin", "--json", "a short variant")
    session.run(twin)
    import json

    assert json.loads((session.cwd / "tasks.json").read_text())  # --json reached the command
    out = session.run(parse)
    assert "parsed: esreason experiment run configs/experiments/easy.yaml" in out
    assert "not run (needs the cluster): ray start --head" in out


def test_parse_only_scripts_stop_after_their_arguments(tmp_path):
    """A benchmark that exits 2 on a machine without CUDA once it runs is only parsed; a shell script is
    syntax-checked, not run; a renamed flag or a missing script fails. (A session of its own: the shared one
    has left the repository root.)"""
    parse = "```bash\n# [CI parses this only: needs a GPU and vLLM]\n"
    with Session(tmp_path, timeout=300) as session:
        (block,) = _page(parse + "python benchmarks/gpu_es_step.py --models qwen2.5-0.5b --tokens 8\n"
                         "bash scripts/gpu-acceptance.sh --sections es_resume --budget-s 240\n```\n")
        out = session.run(block)
        assert "parsed: python benchmarks/gpu_es_step.py --models qwen2.5-0.5b --tokens 8" in out
        assert "not run (syntax checked): bash scripts/gpu-acceptance.sh" in out
        for text, message in ((parse + "python benchmarks/gpu_es_step.py --no-such-flag\n```\n", "exit 2"),
                              (parse + "bash scripts/no-such-script.sh --tiny\n```\n", "no such file")):
            with pytest.raises(DocsError, match=message):
                session.run(_page(text)[0])


def test_the_readme_figure_is_what_the_demo_report_writes():
    """docs/figures/demo-passk.png is runs/demo/report/passk_profiles.png of a full `esreason demo`
    (`cp runs/demo/report/passk_profiles.png docs/figures/demo-passk.png`); the report still names its
    Pass@K figure so, and tests/test_demo.py checks that the demo's report writes every figure it names."""
    from esreason.report.plots import file_names

    assert "docs/figures/demo-passk.png" in (REPO / "README.md").read_text()
    assert (REPO / "docs" / "figures" / "demo-passk.png").is_file()
    assert file_names()["profiles"] == "passk_profiles.png"


@pytest.mark.parametrize("text", ["```bash\npip install -e '.[ray]'\n```\n",
                                  "```bash\n# [CI runs this with --set train.max_steps=1: short]\ncd x && pip install .\n```\n"])
def test_a_block_that_would_install_is_refused(text):
    """Run in the page's copy of the tree, `pip install -e` would re-point the docs run's environment at a
    directory deleted after the page (it happened: every later test lost esreason)."""
    (block,) = _page(text)
    with pytest.raises(DocsError, match="pip install"):
        check_labels(block)
    check_labels(Block(block.page, block.line, block.lang, block.code, "parse", "", "an install"))
