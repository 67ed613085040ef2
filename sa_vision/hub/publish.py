""" Publishing an exported folder to the Hugging Face Hub, after checking token, permission and target """
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, List, NamedTuple, Optional, Union

from ..errors import UserError
from ..models._pretrained import PRETRAINED_TAG, hub_error_reason, hub_read_errors, hub_repo_id, registered_hf_hub_id
from .card import card_for_repository
from .labels import EXPORT_FILES, HUB_FOLDER_FILES, WeightsLabel

__all__ = ['HubPublishError', 'PublishedFolder', 'check_repo_id', 'check_publish_target', 'resolve_token',
           'card_to_upload', 'upload_files', 'publish_hub_folder']


class HubPublishError(UserError):
    """Publishing cannot start: no token, no write permission, or a repository these weights may not go to."""


class PublishedFolder(NamedTuple):
    """Where a folder went: the repository the Hub created (``<namespace>/<name>``), and its commit."""
    repo_id: str
    commit: Any


def check_repo_id(repo_id: str) -> None:
    """A repository id the Hub takes (``<name>`` or ``<namespace>/<name>``), by huggingface_hub's own check."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id
    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        reason = str(e).replace(' Use `repo_type` argument if needed.', '')  # an argument of the Python API only
        raise HubPublishError(f'{repo_id!r} is not a Hub repository id ({reason}); name one as <namespace>/<name>, '
                              f'or <name> for your own namespace; nothing was uploaded') from None


def check_publish_target(label: WeightsLabel, repo_id: str) -> None:
    """Refuse a repository id the Hub does not take, or a repository that must not receive these weights (the
    registered one, another architecture's)."""
    import timm
    check_repo_id(repo_id)
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


def upload_files(folder: Union[str, os.PathLike]) -> List[str]:
    """The names of the files an upload of the exported ``folder`` sends: those an export writes
    (``EXPORT_FILES``; a link among them sends the file it names, as a Hub cache's snapshot holds them). Other
    files and subfolders stay behind. A link to nothing is refused: the upload would delete its file on the Hub."""
    folder = Path(folder)
    broken = [name for name in EXPORT_FILES if (folder / name).is_symlink() and not (folder / name).exists()]
    if broken:
        raise HubPublishError(f'{folder} holds links to nothing in place of {", ".join(broken)}: put the files back '
                              f'(or remove the links); nothing was uploaded')
    return sorted(name for name in EXPORT_FILES if (folder / name).is_file())


def publish_hub_folder(
        folder: Union[str, os.PathLike],
        repo_id: str,
        token: Optional[str] = None,
        private: bool = False,
        commit_message: str = 'Add weights trained with sa_vision',
        create_pr: bool = False,
) -> PublishedFolder:
    """Upload an exported folder to ``repo_id`` in one commit, after checking files, token and permission; the
    uploaded card names the repository the Hub created (``<name>`` goes to the token's own namespace)."""
    from huggingface_hub import HfApi
    folder = Path(folder)
    check_repo_id(repo_id)
    missing = [name for name in HUB_FOLDER_FILES if not (folder / name).is_file()]
    if missing:
        raise HubPublishError(f'{folder} is not a complete export (missing {missing}); run the export first')
    _check_folder_target(folder, repo_id)
    token = resolve_token(token)
    api = HfApi(token=token, library_name='timm')
    with _hub_answers(repo_id):
        repo_id = _create_repo(api, repo_id, private)
        _check_folder_target(folder, repo_id)  # '<name>' became '<namespace>/<name>'
        with _card_naming(folder, repo_id) as upload:
            commit = _upload(api, upload, repo_id, commit_message, create_pr)
    return PublishedFolder(repo_id, commit)


@contextmanager
def _hub_answers(repo_id: str) -> Iterator[None]:
    """The Hub client's "offline" and "no answer" errors (:func:`~sa_vision.models._pretrained.hub_read_errors`)
    as one :class:`HubPublishError` saying what to do."""
    known = hub_read_errors()
    try:
        yield
    except tuple(known) as e:
        from huggingface_hub import constants
        offline = ', unset HF_HUB_OFFLINE,' if constants.HF_HUB_OFFLINE else ''
        raise HubPublishError(
            f'cannot publish to {repo_id}: the Hugging Face Hub could not be reached ({hub_error_reason(e, known)}); '
            f'publishing needs the network: connect{offline} and run the same command again; nothing was '
            f'uploaded') from None


def _create_repo(api, repo_id: str, private: bool) -> str:
    """The repository, created where the token may write to it: its id as the Hub gives it back."""
    from huggingface_hub.errors import HfHubHTTPError
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
        # None, not False: a new repository takes its namespace's default visibility unless --private asks
        repo_id = api.create_repo(repo_id, private=private or None, exist_ok=True).repo_id
        public = private and not api.repo_info(repo_id).private
    except HfHubHTTPError as e:
        raise HubPublishError(f'cannot create or access {repo_id} ({_status(e)}); check the token\'s '
                              f'permission on {namespace!r}; nothing was uploaded') from None
    if public:  # the Hub keeps an existing repository's visibility, whatever create_repo is asked
        raise HubPublishError(f'{repo_id} exists and is public, so --private cannot keep these weights private; make '
                              f'it private in its settings (https://huggingface.co/{repo_id}/settings) or publish '
                              f'without --private; nothing was uploaded')
    return repo_id


def _upload(api, folder: Path, repo_id: str, commit_message: str, create_pr: bool):
    from huggingface_hub.errors import HfHubHTTPError
    try:
        # an earlier export's files that this one lacks (a recipe, a figure, pickled weights) would stay beside it
        return api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message=commit_message,
                                 create_pr=create_pr, allow_patterns=upload_files(folder),
                                 delete_patterns=[*EXPORT_FILES, 'pytorch_model.bin'])
    except HfHubHTTPError as e:
        raise HubPublishError(f'the Hub refused the upload to {repo_id} ({_status(e)}); nothing was '
                              f'committed') from None


def card_to_upload(folder: Union[str, os.PathLike], repo_id: str) -> str:
    """The card an upload of the exported ``folder`` to ``repo_id`` carries: its usage section rebuilt for that
    repository (with this sa_vision's install line), the rest as the folder holds it."""
    folder = Path(folder)
    card = (folder / 'README.md').read_text(encoding='utf-8')
    return card_for_repository(card, json.loads((folder / 'config.json').read_text(encoding='utf-8')), repo_id)


@contextmanager
def _card_naming(folder: Path, repo_id: str) -> Iterator[Path]:
    """The folder to upload: a copy with :func:`card_to_upload`'s card (``folder`` itself where that is its card);
    ``folder`` is never changed (a kept zoo folder)."""
    retargeted = card_to_upload(folder, repo_id)
    if retargeted == (folder / 'README.md').read_text(encoding='utf-8'):
        yield folder
        return
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / folder.name
        staged.mkdir()
        for name in upload_files(folder):
            shutil.copyfile(folder / name, staged / name)
        (staged / 'README.md').write_text(retargeted, encoding='utf-8')
        yield staged


def _check_folder_target(folder: Path, repo_id: str) -> None:
    """The registered repository takes only folders labelled as the reference weights (tag 'cifar10')."""
    config = json.loads((folder / 'config.json').read_text(encoding='utf-8'))
    arch, tag = config.get('architecture', ''), (config.get('pretrained_cfg') or {}).get('tag')
    if arch and repo_id == registered_hf_hub_id(arch) and tag != PRETRAINED_TAG:
        raise HubPublishError(
            f'refusing {repo_id}: timm.create_model({arch!r}, pretrained=True) downloads that repository for '
            f'everyone, and {folder} holds {arch}.{tag} weights, not CIFAR-10 weights of the paper\'s architecture; '
            f'publish to {hub_repo_id(arch, tag)} or your own --repo-id; nothing was uploaded')


def _status(error) -> str:
    response = getattr(error, 'response', None)
    return f'HTTP {response.status_code}' if response is not None else type(error).__name__
