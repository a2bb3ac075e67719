"""CUDA kernels of the convolutions and pooling in nestflow/ops/nn.py (conv2d,
depthwise_conv2d, conv2d_transpose and its depthwise form, pool2d), NCHW float32/float64 on
CUDAPlace.

A conv is im2col into columns [groups, C/g * kh * kw, N * OH * OW] (one RawKernel, one thread
per column element, zero where a kernel offset reads padding), then one cuBLAS GEMM per group;
a last kernel moves the GEMM's [M, N, OH * OW] product to NCHW and adds the fused conv's bias
and residual and its relu on the way. The input gradient is the transposed GEMM into columns,
then col2im as a gather: each thread owns one input element and sums the column entries of
every kernel offset that read it (no atomics: the same bits on every run). An unpadded 1x1
stride-1 conv of one image needs no columns (they are the image as it lies); a batch goes
through im2col too, as CuPy runs the per-image GEMMs as a pointer-array batch, which on W9's
1x1 conv (H200) took 1.2x the forward's and 1.5x the gradients' time of im2col and one GEMM.

pool2d is one thread per output (its window's max or average) and, for its gradient, one per
input element summing the windows that hold it; max pooling first marks each window's
gradient target (the first element equal to Out, row-major, as the xp body's rule).

The functions take the resolved geometry (nn.py's _ConvGeometry or _PoolGeometry) and the
CUDADeviceContext; nn.py's ops check their attrs, call them and fall back to their xp bodies
for what `covers` refuses.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SOURCE", "covers", "conv", "input_grad", "grads", "relu_grad", "pool", "pool_grad"]

_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

# The kernels run on a grid of (pixel blocks, rows or channels, images): a thread divides once
# to find its pixel, where a flat index takes six divisions. Each body is a template over its
# index type: 32-bit offsets where every array the launch touches has at most _NARROW
# elements, 64-bit past that.
SOURCE = r"""
template <typename I>
__device__ void im2col(const T* __restrict__ x, T* __restrict__ cols, int C, int H, int W,
                       int N, int OH, int OW, int KH, int KW, int sh, int sw, int pt, int pl,
                       int dh, int dw, int relu) {
    const int P = OH * OW, rows = C * KH * KW;
    for (int row = blockIdx.y; row < rows; row += gridDim.y) {
        const int kj = row % KW, r = row / KW;
        const int ki = r % KH, c = r / KH;
        for (int n = blockIdx.z; n < N; n += gridDim.z) {
            const T* xc = x + ((I)n * C + c) * H * W;
            T* out = cols + ((I)row * N + n) * P;
            for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < P;
                 p += gridDim.x * blockDim.x) {
                const int oh = p / OW, ow = p - oh * OW;
                const int h = oh * sh - pt + ki * dh, w = ow * sw - pl + kj * dw;
                T v = 0;
                if (h >= 0 && h < H && w >= 0 && w < W) {
                    v = xc[h * W + w];
                    if (relu && v < (T)0) v = 0;  // NaN stays NaN, as with maximum(x, 0)
                }
                out[p] = v;
            }
        }
    }
}

template <typename I>
__device__ void col2im(const T* __restrict__ cols, const T* __restrict__ x,
                       T* __restrict__ dx, int C, int H, int W, int N, int OH, int OW,
                       int KH, int KW, int sh, int sw, int pt, int pl, int dh, int dw,
                       int relu) {
    const I rowstride = (I)N * OH * OW;
    for (int c = blockIdx.y; c < C; c += gridDim.y) {
        for (int n = blockIdx.z; n < N; n += gridDim.z) {
            const I image = ((I)n * C + c) * H * W;
            const T* col = cols + (I)c * KH * KW * rowstride + (I)n * OH * OW;
            for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < H * W;
                 p += gridDim.x * blockDim.x) {
                const int h = p / W, w = p - h * W;
                T s = 0;
                for (int ki = 0; ki < KH; ++ki) {
                    int oh = h + pt - ki * dh;
                    if (sh > 1) {
                        if (oh < 0 || oh % sh) continue;
                        oh /= sh;
                    }
                    if (oh < 0 || oh >= OH) continue;
                    for (int kj = 0; kj < KW; ++kj) {
                        int ow = w + pl - kj * dw;
                        if (sw > 1) {
                            if (ow < 0 || ow % sw) continue;
                            ow /= sw;
                        }
                        if (ow < 0 || ow >= OW) continue;
                        s += col[(I)(ki * KW + kj) * rowstride + oh * OW + ow];
                    }
                }
                if (relu) s *= (T)(x[image + p] > (T)0);  // dx * (x > 0), as the xp body
                dx[image + p] = s;
            }
        }
    }
}

template <typename I>
__device__ void conv_finish(const T* __restrict__ y, const T* __restrict__ bias,
                            const T* __restrict__ res, T* __restrict__ out, int N, int M,
                            int P, int OW, long long y_sn, long long y_sm, long long r_sn,
                            long long r_sm, long long r_sh, long long r_sw, int has_bias,
                            int has_res, int relu) {
    for (int m = blockIdx.y; m < M; m += gridDim.y) {
        const T b = has_bias ? bias[m] : (T)0;
        for (int n = blockIdx.z; n < N; n += gridDim.z) {
            const T* src = y + (I)n * (I)y_sn + (I)m * (I)y_sm;
            T* dst = out + ((I)n * M + m) * P;
            const T* r = res + (I)n * (I)r_sn + (I)m * (I)r_sm;
            for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < P;
                 p += gridDim.x * blockDim.x) {
                T v = src[p];
                if (has_bias) v += b;
                if (has_res) {
                    const int oh = p / OW, ow = p - oh * OW;
                    v += r[(I)oh * (I)r_sh + (I)ow * (I)r_sw];
                }
                if (relu && v < (T)0) v = 0;
                dst[p] = v;
            }
        }
    }
}

// The pool window of output (oh, ow): rows [h0, h1), columns [w0, w1) of the input, clipped
// to it; an adaptive pool's cells are floor(i * H / OH) .. ceil((i + 1) * H / OH).
struct Window {
    int h0, h1, w0, w1, hs, ws;
};

__device__ Window pool_window(int oh, int ow, int H, int W, int OH, int OW, int KH, int KW,
                              int sh, int sw, int pt, int pl, int adaptive) {
    Window win;
    if (adaptive) {
        win.h0 = oh * H / OH;
        win.h1 = ((oh + 1) * H + OH - 1) / OH;
        win.w0 = ow * W / OW;
        win.w1 = ((ow + 1) * W + OW - 1) / OW;
        win.hs = win.h0;
        win.ws = win.w0;
    } else {
        win.hs = oh * sh - pt;
        win.ws = ow * sw - pl;
        win.h0 = max(win.hs, 0);
        win.h1 = min(win.hs + KH, H);
        win.w0 = max(win.ws, 0);
        win.w1 = min(win.ws + KW, W);
    }
    return win;
}

// What an average divides by: the window's input elements (exclusive, adaptive) or kh * kw.
__device__ T pool_divisor(const Window& win, int KH, int KW, int exclusive, int adaptive) {
    if (exclusive || adaptive) return (T)((win.h1 - win.h0) * (win.w1 - win.w0));
    return (T)(KH * KW);
}

template <typename I>
__device__ void pool(const T* __restrict__ x, T* __restrict__ out, int C, int H, int W,
                     int N, int OH, int OW, int KH, int KW, int sh, int sw, int pt, int pl,
                     int is_max, int exclusive, int adaptive) {
    for (int c = blockIdx.y; c < C; c += gridDim.y) {
        for (int n = blockIdx.z; n < N; n += gridDim.z) {
            const T* xc = x + ((I)n * C + c) * H * W;
            T* oc = out + ((I)n * C + c) * OH * OW;
            for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < OH * OW;
                 p += gridDim.x * blockDim.x) {
                const int oh = p / OW, ow = p - oh * OW;
                const Window win =
                    pool_window(oh, ow, H, W, OH, OW, KH, KW, sh, sw, pt, pl, adaptive);
                T acc = is_max ? xc[win.h0 * W + win.w0] : (T)0;
                for (int h = win.h0; h < win.h1; ++h) {
                    for (int w = win.w0; w < win.w1; ++w) {
                        const T v = xc[h * W + w];
                        if (!is_max) acc += v;
                        else if (acc == acc && !(v <= acc)) acc = v;  // NaN wins, as maximum
                    }
                }
                oc[p] = is_max ? acc : acc / pool_divisor(win, KH, KW, exclusive, adaptive);
            }
        }
    }
}

// Per output, the input pixel (h * W + w) its max pool gradient goes to, -1 for none: the
// first element of the window, row-major, equal to Out (padding reads -inf); for an adaptive
// pool the cell's argmax (its first maximum, or first NaN).
template <typename I>
__device__ void pool_argmax(const T* __restrict__ x, const T* __restrict__ out,
                            int* __restrict__ picked, int C, int H, int W, int N, int OH,
                            int OW, int KH, int KW, int sh, int sw, int pt, int pl,
                            int adaptive) {
    for (int c = blockIdx.y; c < C; c += gridDim.y) {
        for (int n = blockIdx.z; n < N; n += gridDim.z) {
            const T* xc = x + ((I)n * C + c) * H * W;
            const I first = ((I)n * C + c) * OH * OW;
            for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < OH * OW;
                 p += gridDim.x * blockDim.x) {
                const int oh = p / OW, ow = p - oh * OW;
                const Window win =
                    pool_window(oh, ow, H, W, OH, OW, KH, KW, sh, sw, pt, pl, adaptive);
                int at = -1;
                if (adaptive) {
                    T best = xc[win.h0 * W + win.w0];
                    at = win.h0 * W + win.w0;
                    for (int h = win.h0; h < win.h1; ++h) {
                        for (int w = win.w0; w < win.w1; ++w) {
                            const T v = xc[h * W + w];
                            if (best == best && (v > best || v != v)) {
                                best = v;
                                at = h * W + w;
                            }
                        }
                    }
                } else {
                    const T o = out[first + p];
                    const bool padding_matches = isinf(o) && o < (T)0;
                    bool done = false;
                    for (int i = 0; i < KH && !done; ++i) {
                        const int h = win.hs + i;
                        for (int j = 0; j < KW && !done; ++j) {
                            const int w = win.ws + j;
                            const bool inside = h >= 0 && h < H && w >= 0 && w < W;
                            if (inside ? xc[h * W + w] == o : padding_matches) {
                                at = inside ? h * W + w : -1;  // padding first: lost
                                done = true;
                            }
                        }
                    }
                }
                picked[first + p] = at;
            }
        }
    }
}

// dX of pool2d, one thread per input element: the sum over the windows that hold it of their
// Out gradient (max: where `picked` names this element) or its share (avg).
template <typename I>
__device__ void pool_grad(const T* __restrict__ grad, const int* __restrict__ picked,
                          T* __restrict__ dx, int C, int H, int W, int N, int OH, int OW,
                          int KH, int KW, int sh, int sw, int pt, int pl, int is_max,
                          int exclusive, int adaptive) {
    for (int c = blockIdx.y; c < C; c += gridDim.y) {
        for (int n = blockIdx.z; n < N; n += gridDim.z) {
            const I first = ((I)n * C + c) * OH * OW;
            T* dc = dx + ((I)n * C + c) * H * W;
            for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < H * W;
                 p += gridDim.x * blockDim.x) {
                const int h = p / W, w = p - h * W;
                int oh0, oh1, ow0, ow1;  // the outputs whose windows may hold (h, w)
                if (adaptive) {
                    oh0 = h * OH / H;
                    oh1 = min(((h + 1) * OH + H - 1) / H, OH);
                    ow0 = w * OW / W;
                    ow1 = min(((w + 1) * OW + W - 1) / W, OW);
                } else {
                    const int top = h + pt - KH + 1, left = w + pl - KW + 1;
                    oh0 = top <= 0 ? 0 : (top + sh - 1) / sh;
                    oh1 = min((h + pt) / sh + 1, OH);
                    ow0 = left <= 0 ? 0 : (left + sw - 1) / sw;
                    ow1 = min((w + pl) / sw + 1, OW);
                }
                T s = 0;
                for (int oh = oh0; oh < oh1; ++oh) {
                    for (int ow = ow0; ow < ow1; ++ow) {
                        const int o = oh * OW + ow;
                        if (is_max) {
                            if (picked[first + o] == p) s += grad[first + o];
                            continue;
                        }
                        const Window win =
                            pool_window(oh, ow, H, W, OH, OW, KH, KW, sh, sw, pt, pl, adaptive);
                        if (h < win.h0 || h >= win.h1 || w < win.w0 || w >= win.w1) continue;
                        s += grad[first + o] / pool_divisor(win, KH, KW, exclusive, adaptive);
                    }
                }
                dc[p] = s;
            }
        }
    }
}

#define NESTFLOW_CONV_KERNELS(SUFFIX, I)                                                      \
extern "C" __global__ void nestflow_im2col##SUFFIX(                                          \
        const T* x, T* cols, int C, int H, int W, int N, int OH, int OW, int KH, int KW,     \
        int sh, int sw, int pt, int pl, int dh, int dw, int relu) {                          \
    im2col<I>(x, cols, C, H, W, N, OH, OW, KH, KW, sh, sw, pt, pl, dh, dw, relu);            \
}                                                                                            \
extern "C" __global__ void nestflow_col2im##SUFFIX(                                          \
        const T* cols, const T* x, T* dx, int C, int H, int W, int N, int OH, int OW,        \
        int KH, int KW, int sh, int sw, int pt, int pl, int dh, int dw, int relu) {          \
    col2im<I>(cols, x, dx, C, H, W, N, OH, OW, KH, KW, sh, sw, pt, pl, dh, dw, relu);        \
}                                                                                            \
extern "C" __global__ void nestflow_conv_finish##SUFFIX(                                     \
        const T* y, const T* bias, const T* res, T* out, int N, int M, int P, int OW,        \
        long long y_sn, long long y_sm, long long r_sn, long long r_sm, long long r_sh,      \
        long long r_sw, int has_bias, int has_res, int relu) {                               \
    conv_finish<I>(y, bias, res, out, N, M, P, OW, y_sn, y_sm, r_sn, r_sm, r_sh, r_sw,       \
                   has_bias, has_res, relu);                                                 \
}

#define NESTFLOW_POOL_KERNELS(SUFFIX, I)                                                      \
extern "C" __global__ void nestflow_pool##SUFFIX(                                            \
        const T* x, T* out, int C, int H, int W, int N, int OH, int OW, int KH, int KW,      \
        int sh, int sw, int pt, int pl, int is_max, int exclusive, int adaptive) {           \
    pool<I>(x, out, C, H, W, N, OH, OW, KH, KW, sh, sw, pt, pl, is_max, exclusive,           \
            adaptive);                                                                       \
}                                                                                            \
extern "C" __global__ void nestflow_pool_argmax##SUFFIX(                                     \
        const T* x, const T* out, int* picked, int C, int H, int W, int N, int OH, int OW,   \
        int KH, int KW, int sh, int sw, int pt, int pl, int adaptive) {                      \
    pool_argmax<I>(x, out, picked, C, H, W, N, OH, OW, KH, KW, sh, sw, pt, pl, adaptive);    \
}                                                                                            \
extern "C" __global__ void nestflow_pool_grad##SUFFIX(                                       \
        const T* grad, const int* picked, T* dx, int C, int H, int W, int N, int OH, int OW, \
        int KH, int KW, int sh, int sw, int pt, int pl, int is_max, int exclusive,           \
        int adaptive) {                                                                      \
    pool_grad<I>(grad, picked, dx, C, H, W, N, OH, OW, KH, KW, sh, sw, pt, pl, is_max,       \
                 exclusive, adaptive);                                                       \
}

NESTFLOW_CONV_KERNELS(32, int)
NESTFLOW_CONV_KERNELS(64, long long)
NESTFLOW_POOL_KERNELS(32, int)
NESTFLOW_POOL_KERNELS(64, long long)
"""

_NARROW = 1 << 30
_GRID_MOST = 65535  # CUDA's limit on a grid's y and z sizes (the kernels loop past it)


def _launch(device, name: str, dtype, pixels: int, rows: int, n: int, largest: int, args):
    """Run SOURCE's kernel `name` on a grid of (pixel blocks, rows, images), in 32-bit offsets
    when no array it touches has more than _NARROW (`largest`) elements. A block is at most
    256 threads, fewer for small images (a 7x7 image would idle 207 of them)."""
    kernel = device.raw_kernel(SOURCE, name + ("32" if largest <= _NARROW else "64"), dtype)
    threads = min(256, -(-pixels // 32) * 32)
    grid = (min(-(-pixels // threads), 1 << 20), min(rows, _GRID_MOST), min(n, _GRID_MOST))
    kernel(grid, (threads,), args)


def _ints(*values) -> tuple:
    return tuple(np.int32(v) for v in values)


def covers(device, *arrays) -> bool:
    """Whether these kernels take these operands (None: an absent optional input): CuPy arrays
    of one dtype, float32 or float64, none of them empty."""
    present = [a for a in arrays if a is not None]
    dtype = present[0].dtype
    return dtype in _DTYPES and all(
        isinstance(a, device.xp.ndarray) and a.dtype == dtype and a.size > 0 for a in present
    )


def _pointwise(k_hw, geo, relu_x: bool) -> bool:
    """An unpadded 1x1 stride-1 conv: one image's columns are its pixels as they lie."""
    return tuple(k_hw) == (1, 1) and geo.strides == (1, 1) and not any(geo.pads) and not relu_x


def _gemm(xp, a, b):
    """a @ b per group. One group multiplies 2-D matrices, where cuBLAS reads a transposed
    operand in place (CuPy's batched matmul copies it to C order first)."""
    if a.shape[0] == 1:
        return xp.matmul(a[0], b[0])[None]
    return xp.matmul(a, b)


def columns(device, x, k_hw, geo, out_hw, relu_x: bool = False):
    """im2col of x [N, C, H, W] (relu applied first with relu_x): [g, C/g * kh * kw,
    N * OH * OW], rows (channel, kernel row, kernel column), columns (image, pixel)."""
    xp = device.xp
    x = xp.ascontiguousarray(x)
    n, c, h, w = x.shape
    (kh, kw), (oh, ow) = k_hw, out_hw
    if n == 1 and _pointwise(k_hw, geo, relu_x):
        return x.reshape(geo.groups, c // geo.groups, h * w)  # the image's pixels as they lie
    cols = xp.empty((geo.groups, c // geo.groups * kh * kw, n * oh * ow), x.dtype)
    dims = _ints(c, h, w, n, oh, ow, kh, kw, *geo.strides, geo.pads[0], geo.pads[2])
    args = (x, cols) + dims + _ints(*geo.dilations, relu_x)
    largest = max(cols.size, x.size)
    _launch(device, "nestflow_im2col", x.dtype, oh * ow, c * kh * kw, n, largest, args)
    return cols


def conv(device, x, w, geo, finish=None, relu_x: bool = False):
    """x [N, C, H, W] (*) w [M, C/g, kh, kw]: (out [N, M, OH, OW], the columns for the filter
    gradient or None). finish: the fused conv's epilogue (nn.py's _Epilogue: bias [M],
    residual broadcastable to out, relu) or None; relu_x: relu on x first."""
    xp = device.xp
    x = xp.ascontiguousarray(x)
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    g = geo.groups
    oh, ow = geo.out_hw((h, wd), (kh, kw))
    cols = columns(device, x, (kh, kw), geo, (oh, ow), relu_x)
    y = _gemm(xp, w.reshape(g, m // g, cg * kh * kw), cols)  # [M, N, OH * OW]
    if n == 1 and _pointwise((kh, kw), geo, relu_x):
        cols = None  # a view of x: free to make again, and keeping it would keep x
        if finish is None:
            return y.reshape(n, m, oh, ow), None  # one image's product is NCHW already
    out = xp.empty((n, m, oh, ow), x.dtype)
    bias = res = None
    res_strides = (0, 0, 0, 0)
    if finish is not None:
        bias = None if finish.bias is None else xp.ascontiguousarray(finish.bias)
        if finish.residual is not None:
            res = xp.ascontiguousarray(finish.residual)
            # broadcast dims (size 1) read the same element: stride 0
            res_strides = tuple(
                0 if d == 1 else s // res.itemsize for d, s in zip(res.shape, res.strides)
            )
    relu = finish is not None and finish.relu
    args = (y, y if bias is None else bias, y if res is None else res, out)
    args += _ints(n, m, oh * ow, ow)
    args += tuple(np.int64(s) for s in (oh * ow, n * oh * ow) + res_strides)
    args += _ints(bias is not None, res is not None, relu)
    largest = max(out.size, 0 if res is None else res.size)
    _launch(device, "nestflow_conv_finish", x.dtype, oh * ow, m, n, largest, args)
    return out, cols


def _grouped(xp, grad, groups: int):
    """grad [N, M, OH, OW] as [g, M/g, N * OH * OW], the columns' layout."""
    n, m = grad.shape[:2]
    t = xp.ascontiguousarray(grad.reshape(n, m, -1).transpose(1, 0, 2))
    return t.reshape(groups, m // groups, -1)


def input_grad(device, grad, w, in_hw, geo, x=None, grad_g=None):
    """d(conv)/d(input) applied to grad [N, M, OH, OW]: [N, C, H, W] for input size in_hw;
    times (x > 0) where x is given (a relu on the conv's input). grad_g: _grouped(grad)."""
    xp = device.xp
    m, cg, kh, kw = w.shape
    g = geo.groups
    n, _, oh, ow = grad.shape
    relu_x = x is not None
    grad_g = _grouped(xp, grad, g) if grad_g is None else grad_g
    wt = w.reshape(g, m // g, cg * kh * kw).transpose(0, 2, 1)
    cols = _gemm(xp, wt, grad_g)  # [g, C/g * kh * kw, N * OH * OW]
    h, wd = in_hw
    if n == 1 and _pointwise((kh, kw), geo, relu_x):
        return cols.reshape(n, g * cg, h, wd)  # one image's columns are NCHW already
    dx = xp.empty((n, g * cg, h, wd), grad.dtype)
    dims = _ints(g * cg, h, wd, n, oh, ow, kh, kw, *geo.strides, geo.pads[0], geo.pads[2])
    x = None if x is None else xp.ascontiguousarray(x)
    args = (cols, dx if x is None else x, dx) + dims + _ints(*geo.dilations, relu_x)
    largest = max(cols.size, dx.size)
    _launch(device, "nestflow_col2im", grad.dtype, h * wd, g * cg, n, largest, args)
    return dx


def grads(device, x, grad, w, geo, need_dx: bool, need_dw: bool, cols=None, relu_x=False):
    """(dx, dw) of the conv of x [N, C, H, W] with w whose output gradient is grad (None
    where not needed). cols: the forward's columns, if kept; relu_x: the conv read relu(x)."""
    xp = device.xp
    m, cg, kh, kw = w.shape
    g = geo.groups
    n, _, oh, ow = grad.shape
    grad_g = _grouped(xp, grad, g) if need_dx or (need_dw and g == 1) else None
    dx = dw = None
    if need_dx:
        dx = input_grad(device, grad, w, x.shape[2:], geo, x if relu_x else None, grad_g)
    if need_dw:
        if cols is None:
            cols = columns(device, x, (kh, kw), geo, (oh, ow), relu_x)
        if g == 1:
            dw = _gemm(xp, grad_g, cols.transpose(0, 2, 1))
        else:
            # batched GEMMs copy a transposed operand: transpose grad (the output's size), not
            # the columns (kh * kw times the input's), and the small product after
            grad_t = xp.ascontiguousarray(
                grad.reshape(n, g, m // g, oh * ow).transpose(1, 0, 3, 2)
            ).reshape(g, n * oh * ow, m // g)
            dw = xp.matmul(cols, grad_t).transpose(0, 2, 1)
        dw = xp.ascontiguousarray(dw).reshape(w.shape)
    return dx, dw


def _pool_dims(shape, geo) -> tuple:
    n, c, h, w = shape
    return _ints(c, h, w, n, *geo.out_hw, *geo.ksize, *geo.strides, geo.pads[0], geo.pads[2])


def pool(device, x, geo, is_max: bool, exclusive: bool):
    """pool2d of x [N, C, H, W] by nn.py's _PoolGeometry: max, or the average dividing by
    the window's input elements (exclusive, adaptive) or by kh * kw."""
    xp = device.xp
    x = xp.ascontiguousarray(x)
    n, c = x.shape[:2]
    out = xp.empty((n, c) + tuple(geo.out_hw), x.dtype)
    args = (x, out) + _pool_dims(x.shape, geo) + _ints(is_max, exclusive, geo.adaptive)
    pixels = out.shape[2] * out.shape[3]
    _launch(device, "nestflow_pool", x.dtype, pixels, c, n, x.size, args)
    return out


def pool_grad(device, x, out, grad, geo, is_max: bool, exclusive: bool):
    """dX of pool2d for Out's gradient `grad`: max pooling's goes to each window's first
    element equal to Out, row-major (an adaptive cell's first maximum), as the xp body's."""
    xp = device.xp
    x, out, grad = (xp.ascontiguousarray(a) for a in (x, out, grad))
    n, c, h, w = x.shape
    dims, largest = _pool_dims(x.shape, geo), max(x.size, out.size)
    picked = grad  # read by max pooling's gradient alone
    if is_max:
        picked = xp.empty(out.shape, np.int32)
        args = (x, out, picked) + dims + _ints(geo.adaptive)
        pixels = out.shape[2] * out.shape[3]
        _launch(device, "nestflow_pool_argmax", x.dtype, pixels, c, n, largest, args)
    dx = xp.empty(x.shape, grad.dtype)
    args = (grad, picked, dx) + dims + _ints(is_max, exclusive, geo.adaptive)
    _launch(device, "nestflow_pool_grad", grad.dtype, h * w, c, n, largest, args)
    return dx


def relu_grad(device, grad, out):
    """grad * (out > 0): the gradient through a fused relu, from its output."""
    kernel = device.elementwise(
        "nestflow_conv_relu_grad", "T g, T y", "T dg", "dg = g * (T)(y > (T)0)"
    )
    return kernel(grad, out)
