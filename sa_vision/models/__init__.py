""" The models: importing this package registers them with timm (``sa_*_cifar``, ``resnet18_cifar``) """
from .factory import UnknownModelError, create_named_model, model_class, model_keywords, model_name_hint
from .param_groups import param_groups_pos_lr, positional_parameter_names
from .resnet_cifar import CifarResNet, infer_cifar_resnet_args
from .sa_cifar import DEFAULT_MODEL_OF_KIND, SA_MODEL_ARGS, SelfAttentionBlock, SelfAttentionNet, check_image_shape
from .sa_state_dict import infer_sa_model_args, is_sa_state_dict

# every model this package registers: the attention models (SA_MODEL_ARGS), then the paper's ResNet baseline
MODEL_NAMES = (*SA_MODEL_ARGS, 'resnet18_cifar')
DEFAULT_MODEL = 'sa_quadratic_cifar'  # the commands' default: the paper's quadratic-encoding model (Table 1)

__all__ = ['MODEL_NAMES', 'DEFAULT_MODEL', 'param_groups_pos_lr', 'positional_parameter_names', 'CifarResNet',
           'SA_MODEL_ARGS', 'DEFAULT_MODEL_OF_KIND', 'SelfAttentionBlock', 'SelfAttentionNet', 'check_image_shape',
           'infer_cifar_resnet_args', 'infer_sa_model_args', 'is_sa_state_dict', 'UnknownModelError',
           'create_named_model', 'model_class', 'model_keywords', 'model_name_hint']
