""" The models: importing this package registers them with timm (``sa_*_cifar``, ``resnet18_cifar``) """
from .factory import UnknownModelError, create_named_model, model_class, model_keywords, model_name_hint
from .param_groups import param_groups_pos_lr, positional_parameter_names
from .resnet_cifar import CifarResNet, infer_cifar_resnet_args
from .sa_cifar import DEFAULT_MODEL_OF_KIND, SA_MODEL_ARGS, SelfAttentionBlock, SelfAttentionNet, check_image_shape
from .sa_state_dict import infer_sa_model_args, is_sa_state_dict

__all__ = ['param_groups_pos_lr', 'positional_parameter_names', 'CifarResNet', 'SA_MODEL_ARGS', 'DEFAULT_MODEL_OF_KIND',
           'SelfAttentionBlock', 'SelfAttentionNet', 'check_image_shape', 'infer_cifar_resnet_args',
           'infer_sa_model_args', 'is_sa_state_dict', 'UnknownModelError', 'create_named_model', 'model_class',
           'model_keywords', 'model_name_hint']
