"""`--push REPO_ID`: the exported folder uploaded to a Hugging Face dataset repo with the Hub's
resumable upload: `upload_large_folder` (huggingface_hub 1.x), or `upload_folder` where 2.0
folded it in (streamed in several commits with hf_xet, resumed by running again). The token
is the Hub's own (HF_TOKEN or `hf auth login`): fleetdeck never reads, asks or stores it."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class PushError(ValueError):
    pass


def push(folder: Path, repo_id: str, private: bool = True, api: Any = None) -> str:
    """Create the dataset repo if needed, then upload `folder`; the repo's URL."""
    try:
        from huggingface_hub import HfApi
        from huggingface_hub.errors import HfHubHTTPError
    except ImportError:
        raise PushError("--push needs huggingface_hub: pip install 'fleetdeck[dataset]'") \
            from None
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise PushError(f"--push {repo_id!r}: give the repo as OWNER/NAME")
    api = api or HfApi()
    try:
        url = api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
        large = getattr(api, "upload_large_folder", None)
        if large is not None:
            large(repo_id=repo_id, folder_path=str(folder), repo_type="dataset",
                  private=private)
        else:
            api.upload_folder(repo_id=repo_id, folder_path=str(folder), repo_type="dataset",
                              commit_message="fleetdeck dataset")
    except HfHubHTTPError as exc:
        raise PushError(f"--push {repo_id}: the Hub answered: {exc}") from None
    except (OSError, ValueError) as exc:
        raise PushError(f"--push {repo_id}: {type(exc).__name__}: {exc}") from None
    return str(url)
