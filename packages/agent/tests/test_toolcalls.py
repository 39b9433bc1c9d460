from cuda_agent.agent.toolcalls import ParsedCall, ToolCallError, format_tool_call, parse_tool_calls


def test_hermes_json_calls_and_thought():
    text = (
        "I will read the reference first.\n"
        '<tool_call>{"name": "Read", "arguments": {"path": "model.py"}}</tool_call>\n'
        '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call>'
    )
    t = parse_tool_calls(text)
    assert t.thought == "I will read the reference first."
    assert [(c.name, c.arguments) for c in t.calls] == [
        ("Read", {"path": "model.py"}),
        ("Bash", {"command": "ls"}),
    ]
    assert [c.id for c in t.calls] == ["call_0", "call_1"]


def test_qwen3_coder_xml_call():
    text = (
        "<tool_call>\n<function=Edit>\n<parameter=path>\nkernels/a.cu\n</parameter>\n"
        "<parameter=old_string>\nx + 1\n</parameter>\n<parameter=new_string>\nx + 2\n"
        "</parameter>\n</function>\n</tool_call>"
    )
    (c,) = parse_tool_calls(text).calls
    assert isinstance(c, ParsedCall)
    assert c.name == "Edit" and c.arguments == {
        "path": "kernels/a.cu",
        "old_string": "x + 1",
        "new_string": "x + 2",
    }


def test_xml_json_valued_parameter():
    text = '<tool_call><function=TodoWrite><parameter=todos>[{"content": "a", "status": "pending"}]</parameter></function></tool_call>'
    (c,) = parse_tool_calls(text).calls
    assert c.arguments["todos"] == [{"content": "a", "status": "pending"}]


def test_arguments_double_encoded_string():
    (c,) = parse_tool_calls(
        '<tool_call>{"name": "Glob", "arguments": "{\\"pattern\\": \\"*\\"}"}</tool_call>'
    ).calls
    assert c.arguments == {"pattern": "*"}


def test_malformed_calls_are_errors_not_exceptions():
    cases = {
        "<tool_call>{not json}</tool_call>": "not valid JSON",
        "<tool_call></tool_call>": "empty",
        '<tool_call>["Read"]</tool_call>': "must be an object",
        '<tool_call>{"arguments": {}}</tool_call>': "no string 'name'",
        '<tool_call>{"name": "Read", "arguments": [1]}</tool_call>': "must be an object",
        '<tool_call>{"name": "Read", "arguments": {"path": "a"}}': "unterminated",
        "<tool_call><function=Read><parameter=path>a</parameter></tool_call>": "malformed XML",
        "<tool_call><function=Read>junk<parameter=path>a</parameter></function></tool_call>": "unexpected text",
    }
    for text, msg in cases.items():
        calls = parse_tool_calls(text).calls
        assert len(calls) == 1 and isinstance(calls[0], ToolCallError), text
        assert msg in calls[0].message, (text, calls[0].message)


def test_unterminated_then_valid():
    text = '<tool_call>{"name": "A"\n<tool_call>{"name": "Glob", "arguments": {"pattern": "*"}}</tool_call>'
    calls = parse_tool_calls(text).calls
    assert isinstance(calls[0], ToolCallError) and isinstance(calls[1], ParsedCall)


def test_no_calls():
    t = parse_tool_calls("just thinking")
    assert t.calls == [] and t.thought == "just thinking"


def test_format_round_trip():
    s = format_tool_call("Write", {"path": "p", "content": "a\n<b>"})
    (c,) = parse_tool_calls(s).calls
    assert c.name == "Write" and c.arguments == {"path": "p", "content": "a\n<b>"}
