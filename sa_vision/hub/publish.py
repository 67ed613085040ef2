""" Publishing an exported folder to the Hugging Face Hub, after checking token, permission and target """
import os
from pathlib import Path
from typing import Optional, Union

from ..errors import UserError
from ..models._pretrained import PRETRAINED_TAG, hub_repo_id, registered_hf_hub_id
from .labels import HUB_FOLDER_FILES, WeightsLabel

__all__ = ['HubPublishError', 'check_publish_target', 'resolve_token', 'publish_hub_folder']


class HubPublishError(UserError):
    """Publishing cannot start: no token, no write permission, or a repository these weights may not go to."""


def check_publish_target(label: WeightsLabel, repo_id: str) -> None:
    """Refuse a repository that must not receive these weights (the registered one, another architecture's)."""
    import timm
    registered = registered_hf_hub_id(label.arch)
    if repo_id == registered and not label.is_reference:
        raise HubPublishError(
            f'refusing {repo_id}: timm.create_model({label.arch!r}, pretrained=True) downloads that repository for '
            f'everyone, and it takes only CIFAR-10 weights of the paper\'s architecture; these are {label.name} '
            f'({label.dataset.title}{"" if label.registered_architecture else ", a custom configuration"}). '
            f'Publish them to {label.default_repo_id} (the default) or your own --repo-id')
    name = repo_id.split('/')[-1].split('.')[0]
    if name != label.arch and timm.is_model(name):
        raise HubPublishError(
            f'the weights are a {label.arch} model but the repository {repo_id} is named for {name}; '
            f'publish to {label.default_repo_id} or pass weights of {name}')


def resolve_token(token: Optional[str] = None) -> str:
    """The token given, else ``HF_TOKEN`` or the ``hf auth login`` one; never printed."""
    from huggingface_hub import get_token
    token = token or os.environ.get('HF_TOKEN') or get_token()
    if not token:
        raise HubPublishError(
            'no Hugging Face token: set the HF_TOKEN environment variable to a token with write access '
            '(https://huggingface.co/settings/tokens) or run `hf auth login`; nothing was uploaded')
    return token


def publish_hub_folder(
        folder: Union[str, os.PathLike],
        repo_id: str,
        token: Optional[str] = None,
        private: bool = False,
        commit_message: str = 'Add weights trained with sa_vision',
        create_pr: bool = False,
):
    """Upload an exported folder to ``repo_id`` in one commit, after checking files, token and permission."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError
    folder = Path(folder)
    missing = [name for name in HUB_FOLDER_FILES if not (folder / name).is_file()]
    if missing:
        raise HubPublishError(f'{folder} is not a complete export (missing {missing}); run the export first')
    _check_folder_target(folder, repo_id)
    token = resolve_token(token)
    api = HfApi(token=token, library_name='timm')
    try:
        who = api.whoami()
    except HfHubHTTPError as e:
        raise HubPublishError(f'the Hugging Face token was refused ({_status(e)}); create a new token with '
                              f'write access and set HF_TOKEN; nothing was uploaded') from None
    namespace = repo_id.split('/')[0] if '/' in repo_id else who.get('name')
    role = ((who.get('auth') or {}).get('accessToken') or {}).get('role')
    allowed = {who.get('name')} | {org.get('name') for org in who.get('orgs', [])}
    if role == 'read' or namespace not in allowed:
        raise HubPublishError(
            f'{who.get("name")} cannot write to {repo_id} (token role {role!r}, namespaces {sorted(allowed)}); '
            f'use a write token of a member of {namespace!r} or another --repo-id; nothing was uploaded')
    try:
        repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
    except HfHubHTTPError as e:
        raise HubPublishError(f'cannot create or access {repo_id} ({_status(e)}); check the token\'s '
                              f'permission on {namespace!r}; nothing was uploaded') from None
    return api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message=commit_message,
                             create_pr=create_pr)


def _check_folder_target(folder: Path, repo_id: str) -> None:
    """The registered repository takes only folders labelled as the reference weights (tag 'cifar10')."""
    import json
    config = json.loads((folder / 'config.json').read_text())
    arch, tag = config.get('architecture', ''), (config.get('pretrained_cfg') or {}).get('tag')
    if arch and repo_id == registered_hf_hub_id(arch) and tag != PRETRAINED_TAG:
        raise HubPublishError(
            f'refusing {repo_id}: timm.create_model({arch!r}, pretrained=True) downloads that repository for '
            f'everyone, and {folder} holds {arch}.{tag} weights, not CIFAR-10 weights of the paper\'s architecture; '
            f'publish to {hub_repo_id(arch, tag)} or your own --repo-id; nothing was uploaded')


def _status(error) -> str:
    response = getattr(error, 'response', None)
    return f'HTTP {response.status_code}' if response is not None else type(error).__name__
