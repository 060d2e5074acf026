"""provenance.json from a real SGLang `/server_info` body (a recorded golden): model files
hashed, live state left out, every secret redacted by name and by value, a new capture
appended only when something differs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import msgspec

from agents.rundir.spec import load_run_spec
from agents.supervise.provenance import LIVE_KEYS, REDACTED, SECRET_ARGS, capture, read, record

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


def test_ordinary_sglang_arguments_survive_and_only_the_secret_ones_are_redacted(
        tmp_path: Path) -> None:
    """Arguments whose names merely hold TOKEN or KEY (max_total_tokens, tokenizer_path,
    speculative_num_draft_tokens, ssl_keyfile: a path) are how the lines were made: kept
    verbatim. The secret ones (by exact name) and the run's secret values are not."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_text("{}")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("{}\n")
    (tmp_path / "run.toml").write_text(
        f'[run]\nname = "r"\n\n[servers]\nurls = ["http://127.0.0.1:9"]\n'
        f'api_key = "sk-topsecret-123"\n\n'
        f'[generate]\nprompts = "{prompts}"\nmodel = "org/not-local"\n'
        f'sampling = {{temperature = 0.6, min_tokens = 16, stop_token_ids = [7]}}\n')
    spec = load_run_spec(tmp_path)
    body = json.loads((GOLDEN / "server_info_dev_g5dd2c243e.json").read_text())
    body |= {"api_key": "sk-topsecret-123", "admin_api_key": "adm-zzzz-999",
             "ssl_keyfile_password": "pw-zzzz-888", "tokenizer_path": str(model),
             "speculative_num_draft_tokens": 4, "ssl_keyfile": "/etc/tls/key.pem"}
    cap = capture(spec, body, None)
    args = cap.server_args
    for name in ("max_total_tokens", "max_prefill_tokens", "tokenizer_path", "tokenizer_mode",
                 "skip_tokenizer_init", "speculative_num_draft_tokens", "ssl_keyfile",
                 "tokenizer_worker_num", "piecewise_cuda_graph_tokens"):
        assert args[name] == body[name], name
    assert {k: args[k] for k in ("api_key", "admin_api_key", "ssl_keyfile_password")} == \
        dict.fromkeys(("api_key", "admin_api_key", "ssl_keyfile_password"), REDACTED)
    # Everything else as the server said it (its command line holds no secret here).
    kept = {k: v for k, v in body.items() if k not in LIVE_KEYS | {"version"} | SECRET_ARGS}
    assert {k: v for k, v in args.items() if k not in SECRET_ARGS} == kept
    assert cap.sampling == {"temperature": 0.6, "min_tokens": 16, "stop_token_ids": [7]}
    # tokenizer_path kept: the model's files are found through it.
    assert cap.model_dir == str(model) and set(cap.model_files) == {"tokenizer.json"}
    text = json.dumps(msgspec.to_builtins(cap))
    assert not any(s in text for s in ("sk-topsecret-123", "adm-zzzz-999", "pw-zzzz-888"))
