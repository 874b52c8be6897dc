"""Training-loop algorithms: Composer's suite in functional form (pure transforms with
explicit keys, module surgery as ``module -> module`` callables, each a :class:`Surgery`
called on the model) and their ``Algorithm``s."""

from sbfunc._namespace import Spelling, api_dir, moved_names
from sbfunc.algorithms._alibi import Alibi, AlibiMultiheadAttention, ZeroEmbedding
from sbfunc.algorithms._augmix import (
    AugMix,
    augmix_image,
)
from sbfunc.algorithms._averaging import (
    EMA,
    SWA,
    AveragedState,
)
from sbfunc.algorithms._blurpool import (
    BlurConv2d,
    BlurMaxPool2d,
    BlurPool,
)
from sbfunc.algorithms._channels_last import ChannelsLast
from sbfunc.algorithms._colout import (
    ColOut,
    colout_batch,
)
from sbfunc.algorithms._cutmix import (
    CutMix,
    cutmix_batch,
)
from sbfunc.algorithms._cutout import CutOut, cutout_batch
from sbfunc.algorithms._deprecated import SPELLINGS
from sbfunc.algorithms._ghost_batchnorm import (
    GhostBatchNorm,
    GhostBatchNorm1d,
    GhostBatchNorm2d,
    GhostBatchNorm3d,
)
from sbfunc.algorithms._label_smoothing import LabelSmoothing, smooth_labels, soft_targets
from sbfunc.algorithms._layer_freezing import LayerFreezing
from sbfunc.algorithms._mixup import MixUp, mixup_batch
from sbfunc.algorithms._randaugment import (
    RandAugment,
    randaugment_image,
)
from sbfunc.algorithms._resizing import (
    ProgressiveResizing,
    resize_batch,
)
from sbfunc.algorithms._sam import (
    SAM,
    sam_gradients,
)
from sbfunc.algorithms._scale_schedule import (
    scale_schedule,
)
from sbfunc.algorithms._seq_length_warmup import SeqLengthWarmup, set_batch_sequence_length
from sbfunc.algorithms._squeeze_excite import (
    SqueezeExcite,
    SqueezeExcite2d,
    SqueezeExciteConv2d,
)
from sbfunc.algorithms._stochastic_depth import (
    StochasticBranch,
    StochasticDepth,
)
from sbfunc.algorithms._surgery import Surgery, replace_modules

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
    "SeqLengthWarmup",
    "SqueezeExcite",
    "SqueezeExcite2d",
    "SqueezeExciteConv2d",
    "StochasticBranch",
    "StochasticDepth",
    "Surgery",
    "ZeroEmbedding",
    "augmix_image",
    "colout_batch",
    "cutmix_batch",
    "cutout_batch",
    "mixup_batch",
    "randaugment_image",
    "replace_modules",
    "resize_batch",
    "sam_gradients",
    "scale_schedule",
    "set_batch_sequence_length",
    "smooth_labels",
    "soft_targets",
]

__getattr__ = moved_names(
    "sbfunc.algorithms",
    ("1.2", ("sbfunc.selective_backprop", ("SelectiveBackprop",))),
    (  # 1.1's function spelling of the surgeries
        "1.2",
        {
            name: Spelling(f"sbfunc.algorithms._deprecated:{name}", f"sbfunc.algorithms.{call}")
            for name, call in SPELLINGS.items()
        },
    ),
)
__dir__ = api_dir(__all__)  # dir() lists the API, not the imports
