"""provenance.json from a real SGLang `/server_info` body (a recorded golden): model files
hashed, live state left out, every secret redacted by name and by value, a new capture
appended only when something differs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from agents.rundir.spec import load_run_spec
from agents.supervise.provenance import REDACTED, capture, read, record

GOLDEN = Path(__file__).parent.parent / "fixtures" / "sglang" / "server_info"


def test_a_capture_hashes_the_model_and_keeps_no_secret(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"a": 1}')
    (model / "tokenizer.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("{}\n")
    (tmp_path / "run.toml").write_text(
        f'[run]\nname = "r"\n\n[servers]\nurls = ["http://127.0.0.1:9"]\n'
        f'api_key = "sk-topsecret-123"\nenv = {{HF_TOKEN = "hf_zzzzsecret"}}\n\n'
        f'[generate]\nprompts = "{prompts}"\nmodel = "{model}"\n'
        f'sampling = {{temperature = 0.6}}\n')
    spec = load_run_spec(tmp_path)
    body = json.loads((GOLDEN / "server_info_dev_g5dd2c243e.json").read_text())
    body |= {"api_key": "sk-topsecret-123", "model_path": str(model)}
    script = "export X=1\npython -m sglang.launch_server --api-key sk-topsecret-123\n"
    cap = capture(spec, body, script)
    assert cap.model_files == {
        "config.json": hashlib.sha256(b'{"a": 1}').hexdigest(),
        "tokenizer.json": hashlib.sha256(b"{}").hexdigest()}
    assert cap.sglang_version == body["version"]
    assert "internal_states" not in cap.server_args
    assert cap.server_args["api_key"] == REDACTED
    assert cap.sampling == {"temperature": 0.6}
    text = json.dumps(cap.__struct_fields__) + repr(cap)
    assert "sk-topsecret-123" not in text and "hf_zzzzsecret" not in text
    assert cap.launch_command is not None and REDACTED in cap.launch_command

    doc, changed = record(tmp_path, cap)
    assert changed and len(doc.captures) == 1
    again, changed = record(tmp_path, capture(spec, body, script))
    assert not changed and len(again.captures) == 1, "the same setup: not appended"
    other = capture(spec, body | {"version": "0.9.9"}, script)
    doc, changed = record(tmp_path, other)
    assert changed and [c.sglang_version for c in doc.captures] == [body["version"], "0.9.9"]
    on_disk = read(tmp_path)
    assert on_disk is not None and len(on_disk.captures) == 2
    assert "sk-topsecret-123" not in (tmp_path / "provenance.json").read_text()
