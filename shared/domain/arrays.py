"""The numpy array types the vectorised key pipeline passes between its modules."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Cols = npt.NDArray[np.uint8]  # digit columns, shape (digits, ids): cols[i] is digit i of each ID
Mask = npt.NDArray[np.bool_]  # one flag per ID
U64 = npt.NDArray[np.uint64]
U32 = npt.NDArray[np.uint32]
