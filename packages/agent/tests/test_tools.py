import pytest

from cuda_agent.agent.solution_parse import parse_files
from cuda_agent.agent.tools import TOOL_NAMES, Toolbox, cap_text, check_arguments


@pytest.fixture
def tb(tmp_path):
    (tmp_path / "model.py").write_text("ref\n")
    (tmp_path / "utils").mkdir()
    (tmp_path / "utils" / "verify.py").write_text("v\n")
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "a.cu").write_text("int x = 1;\nint y = 1;\n")
    (tmp_path.parent / "secret.txt").write_text("s")
    return Toolbox(tmp_path)


def test_tool_set():
    assert TOOL_NAMES == [
        "Bash",
        "Read",
        "Write",
        "Edit",
        "MultiEdit",
        "Glob",
        "Grep",
        "TodoWrite",
        "Submit",
    ]


def test_schema_checks(tb):
    assert "missing required" in tb.call("Read", {}).text
    r = tb.call("Read", {"path": "model.py", "bogus": 1})
    assert r.error == "schema" and "unknown argument" in r.text
    assert tb.call("Read", {"path": 3}).error == "schema"
    assert tb.call("Nope", {}).error == "schema"
    assert check_arguments("Read", {"path": "x", "offset": True}) is not None  # bool is not int
    assert check_arguments("Read", {"path": "x", "offset": 2}) is None


def test_paths_confined_and_protected(tb):
    assert tb.call("Read", {"path": "../secret.txt"}).error == "path"
    assert tb.call("Read", {"path": "/etc/passwd"}).error == "path"
    assert tb.call("Write", {"path": "model.py", "content": "x"}).error == "protected"
    assert tb.call("Write", {"path": "utils/verify.py", "content": "x"}).error == "protected"
    assert (
        tb.call("Edit", {"path": "utils/verify.py", "old_string": "v", "new_string": "w"}).error
        == "protected"
    )
    (tb.root / "link").symlink_to(tb.root.parent / "secret.txt")
    assert tb.call("Read", {"path": "link"}).error == "path"
    assert (tb.root / "model.py").read_text() == "ref\n"


def test_read_write_with_line_numbers(tb):
    assert tb.call("Write", {"path": "kernels/new.cu", "content": "a\nb\nc\n"}).ok
    r = tb.call("Read", {"path": "kernels/new.cu", "offset": 2, "limit": 1})
    assert r.text.startswith("     2\tb") and "1 more lines; use offset=3" in r.text
    assert tb.call("Read", {"path": "missing.cu"}).error == "not_found"


def test_edit_and_multiedit_all_or_nothing(tb):
    r = tb.call("Edit", {"path": "kernels/a.cu", "old_string": "= 1", "new_string": "= 2"})
    assert r.error == "ambiguous"
    assert tb.call(
        "Edit",
        {"path": "kernels/a.cu", "old_string": "= 1", "new_string": "= 2", "replace_all": True},
    ).ok
    assert (tb.root / "kernels/a.cu").read_text() == "int x = 2;\nint y = 2;\n"
    edits = [
        {"old_string": "int x", "new_string": "int xx"},
        {"old_string": "not there", "new_string": "z"},
    ]
    r = tb.call("MultiEdit", {"path": "kernels/a.cu", "edits": edits})
    assert r.error == "not_found" and "edit 2" in r.text
    assert (tb.root / "kernels/a.cu").read_text() == "int x = 2;\nint y = 2;\n"  # untouched
    edits[1] = {"old_string": "int y", "new_string": "int yy"}
    assert tb.call("MultiEdit", {"path": "kernels/a.cu", "edits": edits}).ok
    assert (tb.root / "kernels/a.cu").read_text() == "int xx = 2;\nint yy = 2;\n"


def test_glob_grep_todo_submit(tb):
    assert tb.call("Glob", {"pattern": "kernels/*.cu"}).text == "kernels/a.cu"
    r = tb.call("Grep", {"pattern": r"int \w+ = 1"})
    assert r.text == "kernels/a.cu:1: int x = 1;\nkernels/a.cu:2: int y = 1;"
    assert tb.call("Grep", {"pattern": "("}).error == "schema"
    r = tb.call(
        "TodoWrite",
        {
            "todos": [
                {"content": "write kernel", "status": "done"},
                {"content": "profile", "status": "pending"},
            ]
        },
    )
    assert r.text == "[x] write kernel\n[ ] profile" and len(tb.todos) == 2
    assert tb.call("TodoWrite", {"todos": [{"content": "x", "status": "maybe"}]}).error == "schema"
    assert tb.call("Submit", {}).submit
    assert tb.call("Bash", {"command": "ls"}).error == "unavailable"


def test_cap_text():
    s = "a" * 100 + "b" * 100
    c = cap_text(s, 50)
    assert c.startswith("a" * 25) and c.endswith("b" * 25) and "150 characters cut" in c


def test_parse_single_turn_files():
    text = """Here is my solution.
```python model_new.py
import torch
class ModelNew: pass
```
File: kernels/relu.cu
```cuda
__global__ void k() {}
```
```cpp ../evil.cpp
x
```
```text
notes
```"""
    files, problems = parse_files(text)
    assert set(files) == {"model_new.py", "kernels/relu.cu"}
    assert files["kernels/relu.cu"] == "__global__ void k() {}\n"
    assert any("evil" in p for p in problems) and any("names no file" in p for p in problems)
    files, problems = parse_files("```python\nclass ModelNew: pass\n```")
    assert set(files) == {"model_new.py"} and problems == []
    assert parse_files("no code")[1] == ["no model_new.py block"]
