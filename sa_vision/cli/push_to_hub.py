""" Export trained weights as a Hub folder (timm format + model card) and publish it in one commit

    # the run's export of sa-vision-train --export (its best epoch): list what would be uploaded, then publish it
    sa-vision-push-to-hub output/train/<run>/hub --dry-run
    sa-vision-push-to-hub output/train/<run>/hub
    # other weights (any checkpoint): staged in <the file's folder>/hub, or --out-dir (a Hub folder without a card
    # needs it), then published to sa-vision/<arch>.<tag> (tag: the dataset; '_custom' for another configuration)
    sa-vision-push-to-hub output/train/<run>/last.pth.tar --model sa_quadratic_cifar --dry-run

A complete exported folder is published as it is but for its card's usage, rebuilt for the repository the Hub
creates in the uploaded copy (the dry run lists that card); an export of other weights in the staging folder is
never replaced (an error says what it holds). What is checked before any upload: docs/hub.md, "Publishing".
"""
import argparse
import os
import sys
import textwrap
from pathlib import Path

from sa_vision.errors import UserError, command
from sa_vision.hub import (
    HUB_FOLDER_FILES,
    ExportExistsError,
    HubPublishError,
    card_to_upload,
    card_usage,
    check_finite_weights,
    check_publish_target,
    export_hub_folder,
    publish_hub_folder,
    resolve_token,
    upload_files,
    weights_label,
)
from sa_vision.io import atomic_folder, folder_problem, partial_name
from sa_vision.train.checkpoint import RUN_CHECKPOINT, CheckpointError, read_checkpoint, weights_path


def is_exported_folder(path: Path) -> bool:
    """A complete export (config.json, weights, card), such as a folder kept in the repository's zoo/."""
    return path.is_dir() and all((path / name).is_file() for name in HUB_FOLDER_FILES)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('checkpoint', help='last.pth.tar of sa-vision-train or timm train.py, other weights, or an '
                                           'exported folder (local-dir:<folder> too)')
    parser.add_argument('--model', default=None,
                        help='expected architecture (fail if the weights are of another; names bare weights)')
    parser.add_argument('--use-ema', action='store_true', help='the EMA weights of a timm train.py checkpoint')
    parser.add_argument('--repo-id', default=None, help='target repository (default: sa-vision/<arch>.<tag>)')
    parser.add_argument('--out-dir', default=None,
                        help='staging folder (default: <run>/hub; an export of other weights there is an error)')
    parser.add_argument('--dry-run', action='store_true', help='write the folder and list the files, upload nothing')
    parser.add_argument('--private', action='store_true')
    parser.add_argument('--create-pr', action='store_true', help='open a pull request instead of committing to main')
    parser.add_argument('--commit-message', default='Add weights trained with sa_vision')
    parser.add_argument('--no-figure', action='store_true', help='leave out the attention figure')
    args = parser.parse_args(argv)

    try:
        path = weights_path(args.checkpoint) or Path(args.checkpoint)  # local-dir:<folder>, as timm names it
        ckpt = read_checkpoint(path, arch=args.model, use_ema=args.use_ema)
        label = weights_label(ckpt)
        repo_id = args.repo_id or label.default_repo_id
        check_publish_target(label, repo_id)  # before the (slow) export
        if not args.dry_run:
            resolve_token()  # fail on a missing token before the export
        source = path.resolve()
        into_itself = args.out_dir and Path(args.out_dir).resolve() == source  # refused by the export below
        if is_exported_folder(source) and not into_itself:  # a kept zoo folder: published as it is, or a copy
            _check_exported_folder(source, ckpt, label)
            out_dir = _staged_copy(source, Path(args.out_dir)) if args.out_dir else source
            staged = upload_files(out_dir)
        else:
            if source.is_dir() and not args.out_dir and not (source / RUN_CHECKPOINT).is_file():
                missing = [name for name in HUB_FOLDER_FILES if not (source / name).is_file()]
                raise UserError(f'{source} is a Hub folder without {" and ".join(missing)}, not a complete export: '
                                f'export it into a folder of its own, --out-dir DIR (not staged inside it)')
            out_dir = Path(args.out_dir) if args.out_dir else (source if source.is_dir() else source.parent) / 'hub'
            problem = folder_problem(out_dir)
            if problem:
                raise UserError(f'{"--out-dir" if args.out_dir else "the staging folder"} {out_dir}: {problem}; '
                                f'stage the export in a folder you can write to (--out-dir DIR)')
            staged = export_hub_folder(ckpt, out_dir, repo_id=repo_id, figure=not args.no_figure)
        print(f'Staged {label.name} in {out_dir} for {repo_id}:')
        card = card_to_upload(out_dir, repo_id)  # what the upload carries: the usage rebuilt for repo_id
        rebuilt = card != (out_dir / 'README.md').read_text(encoding='utf-8')
        for name in staged:
            path = out_dir / name
            link = f', the file of the link {name} -> {os.readlink(path)}' if path.is_symlink() else ''
            if name == 'README.md':
                print(f'  {name}  ({len(card.encode("utf-8")):,} bytes{link}'
                      + (f' as uploaded: its usage rebuilt for {repo_id}; the folder\'s is left as it is)'
                         if rebuilt else ')'))
            else:
                print(f'  {name}  ({path.stat().st_size:,} bytes{link})')
        left = sorted(p.name for p in out_dir.iterdir() if p.name not in staged)
        if left:
            print(f'  not uploaded (not written by an export): {", ".join(left)}')
        if args.dry_run:
            if rebuilt:  # the part of the card that names the repository
                print('The uploaded card\'s usage:\n' + textwrap.indent(card_usage(card), '    '))
            own = '' if '/' in repo_id else (f' ({repo_id} goes to the namespace of the token\'s user, '
                                             f'<user>/{repo_id}: the uploaded card names that repository)')
            print(f'Dry run: nothing uploaded{own}.')
            return 0
        published = publish_hub_folder(out_dir, repo_id, private=args.private, commit_message=args.commit_message,
                                       create_pr=args.create_pr)
        print(f'Published {published.repo_id} in one commit: '
              f'{getattr(published.commit, "commit_url", published.commit)}')
    except ExportExistsError as e:
        print(f'error: {e}{"" if args.out_dir else " (another folder: --out-dir DIR)"}', file=sys.stderr)
        return 2
    except (CheckpointError, HubPublishError, FileExistsError) as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
    return 0


def _staged_copy(source: Path, out_dir: Path) -> Path:
    """``out_dir`` holding a copy of the Hub folder ``source`` as it is: its card keeps the run's record, which an
    export of its weights alone would not have. A copy staged before (a dry run's) is staged again."""
    copied = {name: (source / name).read_bytes() for name in upload_files(source)}
    held = {p.name: p.read_bytes() if p.is_file() else None for p in out_dir.iterdir()
            if p.name != partial_name(out_dir)} if out_dir.is_dir() else {}
    problem = folder_problem(out_dir) or (held and held != copied and 'it holds other files')
    if problem:
        raise UserError(f'--out-dir {out_dir}: {problem}; a copy of {source} is staged in a new or empty folder, or '
                        f'one holding that copy')
    with atomic_folder(out_dir) as staging:  # never half a copy, which a second try would take for another's
        staging.mkdir()
        for name, data in copied.items():
            (staging / name).write_bytes(data)
    return out_dir


def _check_exported_folder(source: Path, ckpt, label) -> None:
    """Refuse to publish an exported folder as it is where its weights are not numbers (an export of an sa_vision
    that did not check them), or where its card would name a dataset it was not trained on."""
    check_finite_weights(ckpt.state_dict, str(source))
    written = (ckpt.meta.get('pretrained_cfg') or {}).get('tag')
    if written and written != label.tag:  # its card and config.json would name the dataset it is not
        raise HubPublishError(f'{source} was exported as {label.arch}.{written}, which this sa_vision reads as '
                              f'{label.name} (an image folder named like a dataset known since): export it '
                              f'again from its run\'s checkpoint (sa-vision-push-to-hub '
                              f'<run>/model_best.pth.tar) to publish it as that')


cli = command(__name__)


if __name__ == '__main__':
    sys.exit(cli())
