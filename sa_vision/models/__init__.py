from .resnet_cifar import CifarResNet
from .sa_cifar import SelfAttentionBlock, SelfAttentionNet, check_image_shape
