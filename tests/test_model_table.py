""" ``sa-vision-model-table`` is the one source of docs/models.md's table of sizes and MACs """
from pathlib import Path

import pytest

from sa_vision.cli import model_table

DOCS = Path(__file__).resolve().parent.parent / 'docs' / 'models.md'


@pytest.mark.slow
def test_docs_table_is_the_commands_output(capsys):
    assert model_table.main([]) == 0
    printed = capsys.readouterr().out
    assert printed.count('\n') == 8  # header, rule, the paper's five models and the content kind
    assert printed in DOCS.read_text(encoding='utf-8'), (
        'docs/models.md\'s table differs from sa-vision-model-table; paste its output:\n' + printed)


def test_models_are_chosen_with_m_as_in_the_other_commands(capsys):
    import csv
    import io
    assert model_table.main(['-m', 'resnet18_cifar', '--format', 'csv']) == 0
    (row,) = csv.DictReader(io.StringIO(capsys.readouterr().out))
    assert row['model'] == 'resnet18_cifar' and int(row['params']) == 11_173_962  # timm's resnet18, CIFAR stem
