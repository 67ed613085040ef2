"""sa_vision: the fully-attentional classifiers of Cordonnier, Loukas & Jaggi (ICLR 2020) as timm models.

Importing the package registers the models with timm::

    import sa_vision, timm
    model = timm.create_model('sa_quadratic_cifar')
"""
from . import layers, models
from .models import CifarResNet, SelfAttentionNet

__version__ = '0.2.0'
__all__ = ['CifarResNet', 'SelfAttentionNet', 'layers', 'models', '__version__']
