"""The device the device-dependent tests run on: 'cpu' always, 'cuda' where a GPU is present.

``device`` is the shared parametrization; a test that only makes sense on a GPU is marked ``@pytest.mark.cuda``.
Every CUDA case (a ``device`` of 'cuda' or a ``cuda`` mark) is skipped without a GPU, and
``python -m pytest -m cuda`` selects exactly the CUDA cases.
"""
import pytest
import torch

CUDA = pytest.param('cuda', marks=pytest.mark.cuda)


@pytest.fixture(params=['cpu', CUDA])
def device(request) -> str:
    return request.param


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason='no CUDA device')
    for item in items:
        if item.get_closest_marker('cuda') is not None:
            item.add_marker(skip)
