""" Facts from the paper and its released code, in one place (arXiv 1911.03584, Table 1 / Sec. 4.2, App. A.4) """
from dataclasses import dataclass
from typing import Dict, Optional

__all__ = [
    'ARXIV_ID', 'CIFAR10_MEAN', 'CIFAR10_STD', 'CIFAR10_CLASSES', 'CIFAR10_LABEL_NAMES', 'PAPER_TITLE',
    'PAPER_CITATION', 'PaperResult', 'PAPER_RESULTS', 'PRUNED_HEADS_PER_LAYER', 'PRUNED_FROM',
]

ARXIV_ID = '1911.03584'
PAPER_TITLE = 'On the Relationship between Self-Attention and Convolutional Layers'
PAPER_CITATION = ('@inproceedings{cordonnier2020relationship,\n'
                  '  title={' + PAPER_TITLE + '},\n'
                  '  author={Jean-Baptiste Cordonnier and Andreas Loukas and Martin Jaggi},\n'
                  '  booktitle={International Conference on Learning Representations},\n'
                  '  year={2020},\n'
                  '  url={https://openreview.net/forum?id=HJlnC1rKPB}\n'
                  '}')

# normalisation of the authors' released CIFAR-10 code (the paper states none)
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2023, 0.1994, 0.2010)
CIFAR10_CLASSES = 10
# the dataset's own class names, label i first (its batches.meta; torchvision's CIFAR10.classes): the registered
# cfgs' label_names and the cifar10 dataset entry's class names
CIFAR10_LABEL_NAMES = ('airplane', 'automobile', 'bird', 'cat', 'deer', 'dog', 'frog', 'horse', 'ship', 'truck')

# heads kept per layer after pruning the degenerate heads of a trained generalized model (paper App. A.1)
PRUNED_HEADS_PER_LAYER = (7, 5, 8, 7, 3, 9)
# the pruned model of the table -> the model it is made from: trained, its degenerate heads pruned, then fine-tuned at
# a tenth of the learning rate (App. A.1); never trained from a random initialisation
PRUNED_FROM: Dict[str, str] = {'sa_gen_pruned': 'sa_gen_cifar'}


@dataclass(frozen=True)
class PaperResult:
    """One row of the paper's table, at 10 classes and 32x32 input."""
    description: str
    params: int  # exact, from the released implementation
    top1: float  # CIFAR-10 test accuracy, percent
    gflops: Optional[float]  # as reported; matches 2 x the MACs of the Linear layers (our reading, docs/models.md)


PAPER_RESULTS: Dict[str, PaperResult] = {
    'sa_quadratic_cifar': PaperResult(
        'isotropic Gaussian (quadratic encoding), 9 heads x 6 layers', 12_086_844, 93.8, 6.2),
    'sa_gen_cifar': PaperResult(
        'non-isotropic Gaussian (generalized quadratic), 9 heads x 6 layers', 12_087_006, 93.4, 6.2),
    'sa_gen_pruned': PaperResult('non-isotropic Gaussian, degenerate heads pruned (7,5,8,7,3,9)', 9_686_916, 93.4, 4.9),
    'sa_learned_cifar': PaperResult('learned relative encoding, no content, 9 heads x 6 layers', 12_278_682, 91.8, 6.2),
    'resnet18_cifar': PaperResult('ResNet18, CIFAR stem (3x3, stride 1, no max-pool)', 11_173_962, 93.8, 1.1),
}
