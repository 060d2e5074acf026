"""The loaders' contract: what a saved drafter carries for SGLang, z-lab and SpecForge.

Checked against tests/fixtures/dflash/sglang-loader-contract.md key by key, against the
config SpecForge HEAD's exporter writes for the same drafter, and by loading the checkpoint
back both through `AutoModel.from_pretrained(dir, trust_remote_code=True)` (the checkpoint's
own dflash.py, not our package) and through our own code.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.trainer import golden
from tests.trainer.golden import ATOL, max_diff
from trainer import checkpoint as ckpt
from trainer import contract
from trainer.contract import TargetFacts
from trainer.drafter import DFlashDraftModel, DraftCache

TARGET = TargetFacts(num_layers=8, hidden_size=64, vocab_rows=512)


@pytest.fixture(scope="module", autouse=True)
def _hf_modules(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """trust_remote_code copies dflash.py into transformers' module cache: a private one."""
    import transformers.dynamic_module_utils as dmu

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dmu, "HF_MODULES_CACHE", str(tmp_path_factory.mktemp("hf-modules")))
        yield


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The golden drafter written as a training checkpoint (float32) and for serving."""
    root = tmp_path_factory.mktemp("golden-ckpt")
    out = {}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        (root / name).mkdir()
        ckpt.write_drafter(root / name, golden.model(), dtype)
        out[name] = root / name
    return out


def config(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "config.json").read_text())


def test_every_key_the_loaders_read_is_written_consistently(saved: dict[str, Path]) -> None:
    for dtype, folder in saved.items():
        c = config(folder)
        assert c["architectures"] == ["DFlashDraftModel"]  # SGLang picks the class by it
        assert c["model_type"] == "qwen3"
        assert c["auto_map"] == {"AutoModel": "dflash.DFlashDraftModel"}
        assert (folder / "dflash.py").read_bytes() == contract.modeling_source().read_bytes()
        assert c["num_target_layers"] == 8  # z-lab and SpecForge raise without it
        assert c["block_size"] == c["dflash_config"]["block_size"] == 4
        ids = c["dflash_config"]["target_layer_ids"]
        assert ids == sorted(ids) == [1, 2, 3, 4, 5] and max(ids) <= 8 - 2
        assert 0 <= c["dflash_config"]["mask_token_id"] == 511 < c["vocab_size"] == 512
        assert c["rope_parameters"] == {"rope_theta": 1000000, "rope_type": "default"}
        assert c["rope_theta"] == 1000000  # transformers 4.57 reads only this one
        assert c["dtype"] == c["torch_dtype"] == dtype
        want = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
        tensors = load_file(str(folder / "model.safetensors"))
        assert set(tensors) == set(golden.weights()), "the reference's state_dict names"
        assert {t.dtype for t in tensors.values()} == {want}
        assert not any(k in c for k in contract.EXTENSION_KEYS)
        assert contract.problems(folder, TARGET) == []


def test_the_serving_config_is_specforges_export_key_for_key(saved: dict[str, Path]) -> None:
    """Same drafter, same keys and values as `specforge export --to hf` writes; ours adds
    torch_dtype (older readers) and dflash_config.block_size (SGLang reads it first)."""
    ours = config(saved["bfloat16"])
    theirs = json.loads(golden.SPECFORGE_EXPORT_CONFIG.read_text())
    for key in set(theirs) - {"transformers_version", "dflash_config"}:
        assert ours.get(key) == theirs[key], key
    assert ours["dflash_config"] == {**theirs["dflash_config"], "block_size": 4}
    assert set(ours) - set(theirs) == {"torch_dtype"}


def _cases(m: Any, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    train, one = golden.case("train"), golden.case("infer1")
    with torch.no_grad():
        return {
            "train": m(position_ids=train["position_ids"],
                       attention_mask=train["attention_mask"],
                       noise_embedding=train["noise_embedding"].to(dtype),
                       target_hidden=train["target_hidden"].to(dtype)),
            "infer1": m(position_ids=one["position_ids"],
                        noise_embedding=one["noise_embedding"].to(dtype),
                        target_hidden=one["target_hidden"].to(dtype),
                        past_key_values=DraftCache(), use_cache=True),
        }


def _auto_model(folder: Path, **kw: Any) -> Any:
    from transformers import AutoModel

    m = AutoModel.from_pretrained(str(folder), trust_remote_code=True, **kw).eval()
    # Built from the checkpoint's own dflash.py, not from our package.
    assert type(m).__name__ == "DFlashDraftModel" and type(m) is not DFlashDraftModel
    assert type(m).__module__.startswith("transformers_modules")
    return m


def test_auto_model_builds_the_float32_drafter(saved: dict[str, Path]) -> None:
    folder = saved["float32"]
    hf = _cases(_auto_model(folder, dtype=torch.float32), torch.float32)
    own = _cases(ckpt.load_drafter(folder, TARGET), torch.float32)
    for name, out in hf.items():
        assert max_diff(out, golden.case(name)["output"]) <= ATOL, name
        assert torch.equal(out, own[name]), name


def test_auto_model_builds_the_bfloat16_drafter_in_its_config_dtype(
        saved: dict[str, Path]) -> None:
    folder = saved["bfloat16"]
    m = _auto_model(folder)  # no dtype: transformers 5 takes the config's
    assert {p.dtype for p in m.parameters()} == {torch.bfloat16}
    own_model = ckpt.load_drafter(folder, TARGET)  # float32 holding the bf16 values
    theirs = m.state_dict()
    for name, value in own_model.state_dict().items():
        assert torch.equal(theirs[name], value.to(torch.bfloat16)), name
    hf = _cases(m, torch.bfloat16)
    own = _cases(own_model, torch.float32)
    for name, out in hf.items():
        ref = golden.case(name)["output"]
        # bf16 keeps 8 bits of mantissa; two layers of it stay within 2% of the scale.
        scale = float(ref.abs().max())
        assert max_diff(out, own[name]) <= 0.02 * scale, name
        assert max_diff(out, ref) <= 0.02 * scale, name
        assert max_diff(out, ref) > ATOL, "bf16 really ran"


Mutation = Callable[[Path], None]


def _edit_config(**changes: Any) -> Mutation:
    def apply(folder: Path) -> None:
        c = config(folder)
        for key, value in changes.items():
            parts = key.split(".")
            where = c
            for p in parts[:-1]:
                where = where[p]
            if value is None:
                where.pop(parts[-1], None)
            else:
                where[parts[-1]] = value
        (folder / "config.json").write_text(json.dumps(c))
    return apply


def _edit_weights(fn: Callable[[dict[str, torch.Tensor]], None]) -> Mutation:
    def apply(folder: Path) -> None:
        w = load_file(str(folder / "model.safetensors"))
        fn(w)
        save_file(w, str(folder / "model.safetensors"))
    return apply


@pytest.mark.parametrize(("mutation", "message"), [
    (_edit_config(num_target_layers=None), "num_target_layers: must be the target's depth"),
    (_edit_config(num_target_layers=36), "num_target_layers: 36, but the target has 8"),
    (_edit_config(rope_theta=None), "rope_theta None and rope_parameters.rope_theta"),
    (_edit_config(architectures=["Qwen3ForCausalLM"]), "architectures: must be"),
    (_edit_config(auto_map=None), "auto_map: must be"),
    (_edit_config(**{"dflash_config.target_layer_ids": [5, 4, 3, 2, 1]}), "must be increasing"),
    (_edit_config(**{"dflash_config.target_layer_ids": [1, 2, 3, 4, 7]}), "must lie in 0..6"),
    (_edit_config(**{"dflash_config.mask_token_id": 512}), "512 is outside the vocab"),
    (_edit_config(**{"dflash_config.block_size": 8}), "dflash_config.block_size 8 differs"),
    (_edit_config(dtype="bfloat16", torch_dtype="bfloat16"),
     "tensors are ['F32'], config.json says dtype bfloat16"),
    (_edit_config(quantization_config={"quant_method": "fp8"}), "quantization_config: must be"),
    (_edit_config(num_hidden_layers=3), "missing 11 tensors the config needs"),
    (_edit_weights(lambda w: w.pop("layers.1.self_attn.k_norm.weight")),
     "missing 1 tensors the config needs, e.g. ['layers.1.self_attn.k_norm.weight']"),
    (_edit_weights(lambda w: w.update({"embed_tokens.weight": torch.zeros(512, 64)})),
     "1 tensors the config does not have"),
    (_edit_weights(lambda w: w.update({"fc.weight": torch.zeros(64, 128)})),
     "fc.weight is [64, 128], the config says [64, 320]"),
    (lambda folder: (folder / "dflash.py").unlink(), "dflash.py: missing"),
    (lambda folder: (folder / "model.safetensors").unlink(), "model.safetensors: missing"),
])
def test_each_broken_key_is_named(saved: dict[str, Path], tmp_path: Path, mutation: Mutation,
                                  message: str) -> None:
    folder = tmp_path / "ckpt"
    shutil.copytree(saved["float32"], folder)
    mutation(folder)
    found = contract.problems(folder, TARGET)
    assert any(message in p for p in found), found
