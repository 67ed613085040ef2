#!/usr/bin/env python3
""" Export a training checkpoint as a Hub folder (timm format + model card) and publish it in one commit

    # stage only: write the folder and list what would be uploaded
    python scripts/push_to_hub.py output/train/<run>/last.pth.tar --dry-run
    # publish to sa-vision/<arch>.cifar10 (where timm.create_model('<arch>', pretrained=True) looks);
    # the token comes from HF_TOKEN or `hf auth login` and is never printed
    python scripts/push_to_hub.py output/train/<run>/last.pth.tar --model sa_quadratic_cifar

Checks before anything is uploaded: the checkpoint is readable and of --model's architecture, the repository is
named for that architecture, a token exists and may write to the repository.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a clone without installing
from sa_vision.hub import (  # noqa: E402
    CheckpointError, HubPublishError, default_repo_id, export_hub_folder, load_training_checkpoint,
    publish_hub_folder, resolve_token)


def main(argv=None):
    parser = argparse.ArgumentParser(description='Export a checkpoint to a Hub folder and publish it')
    parser.add_argument('checkpoint', help='last.pth.tar of scripts/train.py')
    parser.add_argument('--model', default=None, help='expected architecture (fail if the checkpoint holds another)')
    parser.add_argument('--repo-id', default=None, help='target repository (default: sa-vision/<arch>.cifar10)')
    parser.add_argument('--out-dir', default=None, help='staging folder (default: <run>/hub)')
    parser.add_argument('--dry-run', action='store_true', help='write the folder and list the files, upload nothing')
    parser.add_argument('--private', action='store_true')
    parser.add_argument('--create-pr', action='store_true', help='open a pull request instead of committing to main')
    parser.add_argument('--commit-message', default='Add weights trained with sa_vision')
    parser.add_argument('--no-figure', action='store_true', help='leave out the attention figure')
    args = parser.parse_args(argv)

    try:
        ckpt = load_training_checkpoint(args.checkpoint)
        repo_id = args.repo_id or default_repo_id(ckpt['arch'])
        if not args.dry_run:
            resolve_token()  # fail on a missing token before the (slow) export
        out_dir = Path(args.out_dir) if args.out_dir else Path(args.checkpoint).resolve().parent / 'hub'
        staged = export_hub_folder(args.checkpoint, out_dir, expected_arch=args.model, repo_id=repo_id,
                                   figure=not args.no_figure)
        print(f'Staged {out_dir} for {repo_id}:')
        for name in staged:
            print(f'  {name}  ({(out_dir / name).stat().st_size:,} bytes)')
        if args.dry_run:
            print('Dry run: nothing uploaded.')
            return 0
        commit = publish_hub_folder(out_dir, repo_id, private=args.private, commit_message=args.commit_message,
                                    create_pr=args.create_pr)
        print(f'Published {repo_id} in one commit: {getattr(commit, "commit_url", commit)}')
    except (CheckpointError, HubPublishError, FileExistsError) as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
    return 0


if __name__ == '__main__':
    sys.exit(main())
