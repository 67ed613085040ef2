"""The device the device-dependent tests run on: 'cpu' always, 'cuda' where a GPU is present.

``device`` is the shared parametrization; a test that only makes sense on a GPU is marked ``@pytest.mark.cuda``.
Every CUDA case (a ``device`` of 'cuda' or a ``cuda`` mark) is skipped without a GPU, and
``python -m pytest -m cuda`` selects exactly the CUDA cases.
"""
import os

import pytest
import torch

CUDA = pytest.param('cuda', marks=pytest.mark.cuda)


@pytest.fixture(params=['cpu', CUDA])
def device(request) -> str:
    return request.param


def pytest_configure(config):
    # under pytest-xdist (.ci/run: -n auto) the workers share the cores: each takes its share of torch's threads, as
    # two processes of sa-vision-train do, instead of every worker spinning on all of them
    workers = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1'))
    if workers > 1:
        torch.set_num_threads(max(1, torch.get_num_threads() // workers))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason='no CUDA device')
    for item in items:
        if item.get_closest_marker('cuda') is not None:
            item.add_marker(skip)
