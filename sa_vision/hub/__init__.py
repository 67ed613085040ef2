""" Hugging Face Hub: labels of exported weights, model cards, export and publishing (paper: arXiv 1911.03584) """
from .card import card_usage, count_params_and_macs, generate_model_card, render_model_card, write_model_cards
from .export import ExportExistsError, check_finite_weights, export_hub_folder
from .labels import (
    CARD_FIGURE_FILENAME,
    CUSTOM_SUFFIX,
    HUB_FOLDER_FILES,
    MODEL_CARD_DIR,
    RECIPE_FILENAME,
    WeightsLabel,
    is_registered_architecture,
    weights_label,
)
from .publish import (
    HubPublishError,
    PublishedFolder,
    card_to_upload,
    check_publish_target,
    check_repo_id,
    publish_hub_folder,
    resolve_token,
    upload_files,
)

__all__ = [
    'HUB_FOLDER_FILES', 'RECIPE_FILENAME', 'CARD_FIGURE_FILENAME', 'CUSTOM_SUFFIX', 'MODEL_CARD_DIR', 'HubPublishError',
    'WeightsLabel', 'weights_label', 'is_registered_architecture', 'check_publish_target',
    'count_params_and_macs', 'generate_model_card', 'write_model_cards', 'render_model_card', 'export_hub_folder',
    'ExportExistsError', 'check_finite_weights', 'resolve_token', 'publish_hub_folder', 'PublishedFolder',
    'check_repo_id', 'card_to_upload', 'card_usage', 'upload_files',
]
