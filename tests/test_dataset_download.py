""" ``--dataset-download`` into a data folder that does not exist yet, without a network: every command that takes it
(train, validate, explore, reproduce) creates the folder and attempts torchvision's download, as torchvision does,
and reports the failed download as one ``error:`` line (which dataset, from where, why, what to do). Errors that are
no failed download keep their traceback.

Nothing here reaches the network: urllib's opener, which torchvision's download calls, is replaced by one that fails
as it does on a machine without a name server (``<urlopen error [Errno -2] Name or service not known>``). """
import socket
import urllib.error
import urllib.request

import pytest
from torchvision.datasets import CIFAR10

from sa_vision.cli import explore, reproduce, train, validate
from sa_vision.errors import run_cli
from sa_vision.reproduce import stages
from sa_vision.train.data import create_image_dataset

TINY = ['--model-kwargs', 'embed_dim=16', 'depth=1', 'heads_per_layer=2', 'mlp_hidden_dim=32']


@pytest.fixture
def opened(monkeypatch):
    """The URLs opened, each failing as without a network."""
    urls = []

    def unreachable(request, *args, **kwargs):
        urls.append(getattr(request, 'full_url', request))
        raise urllib.error.URLError(socket.gaierror(socket.EAI_NONAME, 'Name or service not known'))
    monkeypatch.setattr(urllib.request, 'urlopen', unreachable)
    return urls


def _in_process_training(cmd, tag, trainings=None):
    """A reproduction's training stage run in this process, so that it sees the test's opener."""
    assert cmd[1:3] == ['-m', 'sa_vision.cli.train'], cmd
    return run_cli(train.main, cmd[3:])


# each command as README.md / its docstring gives it, with --dataset-download into data/, which does not exist
COMMANDS = {
    'train': (train, ['-c', 'sa_quadratic_cifar', '--data-dir', '{data}', '--dataset-download',
                      '--experiment', 'sa_quadratic_cifar', '--output', '{out}', *TINY], 2),
    'validate': (validate, ['--model', 'sa_quadratic_cifar', '--no-pretrained', *TINY, '--dataset', 'torch/cifar10',
                            '--data-dir', '{data}', '--dataset-download'], 2),
    'explore': (explore, ['sa_quadratic_cifar', '--no-pretrained', '--out', '{out}/page.html', '--dataset',
                          'torch/cifar10', '--data-dir', '{data}', '--dataset-download'], 2),
    # a failed stage: status 1 after the training's own error line
    'reproduce': (reproduce, ['--profile', 'paper', '--data-dir', '{data}', '--dataset-download', '--out', '{out}',
                              '--train-args=' + ' '.join([*TINY, '--device', 'cpu'])], 1),  # a GPU profile, here
}


@pytest.mark.parametrize('name', list(COMMANDS))
def test_a_failed_download_into_a_new_data_dir_is_one_error_line(name, opened, tmp_path, monkeypatch, capsys):
    script, argv, status = COMMANDS[name]
    monkeypatch.setattr(stages, 'run_training', _in_process_training)
    data = tmp_path / 'data'
    argv = [a.replace('{data}', str(data)).replace('{out}', str(tmp_path / 'out')) for a in argv]
    assert run_cli(script.main, argv) == status
    err = capsys.readouterr().err
    assert 'Traceback' not in err and 'does not exist' not in err, err
    errors = [line for line in err.splitlines() if line.startswith('error: ')]
    line = errors[0]
    assert len(errors) == (2 if name == 'reproduce' else 1), err  # reproduce adds which stage failed
    # the folder was made and the download attempted, from torchvision's own address of CIFAR-10
    assert data.is_dir() and opened == [CIFAR10.url]
    assert line.startswith(f'error: downloading torch/cifar10 from {CIFAR10.url} into {data} failed '
                           f'(URLError: <urlopen error [Errno -2] Name or service not known>)'), line
    assert f'copy it to {data / CIFAR10.filename}' in line, line  # where torchvision looks for it
    assert '--dataset digits' in line and '--dataset fashion-mnist' in line, line  # read without a network


def test_errors_that_are_no_failed_download_keep_their_traceback(tmp_path, monkeypatch):
    def broken_opener(*args, **kwargs):
        raise TypeError('a bug inside the download, not a network failure')
    monkeypatch.setattr(urllib.request, 'urlopen', broken_opener)
    with pytest.raises(TypeError, match='a bug inside the download'):
        create_image_dataset('torch/cifar10', 'test', is_training=False, data_dir=str(tmp_path), download=True)

    def broken_reader(self, *args, **kwargs):
        raise OSError('a failure outside the download')
    monkeypatch.setattr(CIFAR10, '__init__', broken_reader)
    with pytest.raises(OSError, match='a failure outside the download'):
        create_image_dataset('torch/cifar10', 'test', is_training=False, data_dir=str(tmp_path), download=True)


@pytest.mark.parametrize('name, cls', [('torch/mnist', 'MNIST'), ('torch/fashion_mnist', 'FashionMNIST')])
def test_the_mnist_familys_failed_download_is_one_error_line_too(name, cls, opened, tmp_path):
    """torchvision's MNIST family tries each mirror, catches their errors and raises its own after the last: the
    line names the first file, the first mirror's address and the folder torchvision reads it from."""
    import torchvision.datasets

    from sa_vision.errors import DatasetError
    dataset = getattr(torchvision.datasets, cls)
    filename = dataset.resources[0][0]
    with pytest.raises(DatasetError) as failed:
        create_image_dataset(name, 'test', is_training=False, data_dir=str(tmp_path), download=True)
    raw = tmp_path / cls / 'raw'
    assert opened and all(url.endswith(filename) for url in opened)
    assert str(failed.value).startswith(f'downloading {name} from {dataset.mirrors[0]}{filename} into {raw} failed '
                                        f'(RuntimeError: Error downloading {filename}'), failed.value
    assert f'copy it to {raw / filename}' in str(failed.value)
