"""Training-loop algorithms: Composer's suite in functional form (pure transforms with
explicit keys, module surgery as ``module -> module`` functions) and their ``Algorithm``s."""

from sbfunc._namespace import api_dir
from sbfunc.algorithms.alibi import (
    Alibi,
    AlibiMultiheadAttention,
    ZeroEmbedding,
    alibi_bias,
    alibi_slopes,
    apply_alibi,
)
from sbfunc.algorithms.augment import (
    cutout_batch,
    mixup_batch,
    smooth_labels,
    soft_targets,
    window_start,
)
from sbfunc.algorithms.augmix import (
    AugMix,
    augmix_image,
)
from sbfunc.algorithms.averaging import (
    EMA,
    SWA,
    AveragedState,
)
from sbfunc.algorithms.blurpool import (
    BlurConv2d,
    BlurMaxPool2d,
    BlurPool,
    apply_blurpool,
)
from sbfunc.algorithms.channels_last import (
    ChannelsLast,
    apply_channels_last,
    channels_last_tensors,
)
from sbfunc.algorithms.colout import (
    ColOut,
    colout_batch,
)
from sbfunc.algorithms.composer_algorithms import (
    CutOut,
    LabelSmoothing,
    MixUp,
)
from sbfunc.algorithms.cutmix import (
    CutMix,
    cutmix_batch,
)
from sbfunc.algorithms.ghost_batchnorm import (
    GhostBatchNorm,
    GhostBatchNorm1d,
    GhostBatchNorm2d,
    GhostBatchNorm3d,
    apply_ghost_batchnorm,
)
from sbfunc.algorithms.layer_freezing import (
    LayerFreezing,
    freezable_layers,
    freeze_depth,
    freeze_fraction,
)
from sbfunc.algorithms.randaugment import (
    RandAugment,
    randaugment_image,
)
from sbfunc.algorithms.resizing import (
    ProgressiveResizing,
    resize_batch,
)
from sbfunc.algorithms.sam import (
    SAM,
    sam_gradients,
)
from sbfunc.algorithms.scale_schedule import (
    scale_schedule,
)
from sbfunc.algorithms.selective_backprop import (
    SelectiveBackprop,
)
from sbfunc.algorithms.seq_length_warmup import (
    SeqLengthWarmup,
    batch_sequence_length,
    set_batch_sequence_length,
    warmup_sequence_length,
)
from sbfunc.algorithms.squeeze_excite import (
    SqueezeExcite,
    SqueezeExcite2d,
    SqueezeExciteConv2d,
    apply_squeeze_excite,
)
from sbfunc.algorithms.stochastic_depth import (
    StochasticBranch,
    StochasticDepth,
    apply_stochastic_depth,
)
from sbfunc.algorithms.surgery import (
    Selector,
    Surgery,
    matching_modules,
    replace_modules,
    selector,
)

__all__ = [
    "EMA",
    "SAM",
    "SWA",
    "Alibi",
    "AlibiMultiheadAttention",
    "AugMix",
    "AveragedState",
    "BlurConv2d",
    "BlurMaxPool2d",
    "BlurPool",
    "ChannelsLast",
    "ColOut",
    "CutMix",
    "CutOut",
    "GhostBatchNorm",
    "GhostBatchNorm1d",
    "GhostBatchNorm2d",
    "GhostBatchNorm3d",
    "LabelSmoothing",
    "LayerFreezing",
    "MixUp",
    "ProgressiveResizing",
    "RandAugment",
    "SelectiveBackprop",
    "Selector",
    "SeqLengthWarmup",
    "SqueezeExcite",
    "SqueezeExcite2d",
    "SqueezeExciteConv2d",
    "StochasticBranch",
    "StochasticDepth",
    "Surgery",
    "ZeroEmbedding",
    "alibi_bias",
    "alibi_slopes",
    "apply_alibi",
    "apply_blurpool",
    "apply_channels_last",
    "apply_ghost_batchnorm",
    "apply_squeeze_excite",
    "apply_stochastic_depth",
    "augmix_image",
    "batch_sequence_length",
    "channels_last_tensors",
    "colout_batch",
    "cutmix_batch",
    "cutout_batch",
    "freezable_layers",
    "freeze_depth",
    "freeze_fraction",
    "matching_modules",
    "mixup_batch",
    "randaugment_image",
    "replace_modules",
    "resize_batch",
    "sam_gradients",
    "scale_schedule",
    "selector",
    "set_batch_sequence_length",
    "smooth_labels",
    "soft_targets",
    "warmup_sequence_length",
    "window_start",
]


__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
