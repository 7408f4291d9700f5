"""Slot layouts and the diagonal form of the two products: pure numpy, no keys.

Packing is across the batch, never one ciphertext per sample
(docs/crypto-performance.md §6 item 4). A real matrix X (r x c)
becomes complex columns Z_l = X[:, 2l] + i X[:, 2l+1] (both halves of a CKKS
slot carry data); each complex column is a block of ``bp`` slots (bp a power of
two >= r, spread so the columns fill the ciphertexts evenly). At N=8192 (4096
complex slots) a 256 x 64 batch is 2 ciphertexts, 64 x 64 is one.

A product is a :class:`LinearMap`: groups (t, s, delta), each adding
``diag_a * rot(in_t, delta)`` (and, for real-linear maps on complex slots,
``conj(conj(diag_b) * rot(in_t, delta))``) to output ciphertext s, where
``rot(v, k)[j] = v[j + k]`` (SEAL's left rotation). This is the diagonal method
(Halevi-Shoup) on blocks, as PackVFL (arXiv 2405.00482) applies it to split
NNs; :mod:`securevfl.exchange.ckks.kernels` evaluates it with baby-step
giant-step rotations.

* :func:`matmul_map` (Enc(X) W): the block index changes, the row offset does
  not, so the map is a sum of plaintext diagonals times rotations by multiples
  of ``bp``; a real-linear map on complex slots is ``sum a rot(Z) + conj(sum
  conj(b) rot(Z))`` (one conjugation per output ciphertext).
* :func:`tmatmul_map` (p^T Enc(Y)): sums over the rows inside a block. The
  output keeps the input's block stride and puts the a-vector of column group t
  in chunk t of every block, so a term (i, alpha) is a rotation by i - alpha -
  t*A, the same in all blocks; spare chunks take row slices that share their
  diagonals and are folded at the end (``fold``: rotate-and-add steps).

Threat model: none here (layouts are public: both parties know the shapes from
the protocol file). :func:`simulate` evaluates a map on cleartext slots and is
the reference the unit tests hold the maps and the kernels to.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


def pow2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, (n - 1).bit_length())


def _is_pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


@dataclass(frozen=True)
class SlotLayout:
    """Where the complex entry X[i, 2l] + i X[i, 2l+1] lives. Rows are cut in row
    chunks of ``chunk`` (c = i // chunk); complex columns in groups of ``nb``
    (block p = l % nb, group v = l // nb); unit u = c * groups + v goes to
    ciphertext u // (bp // chunk), slot p*bp + (u % (bp // chunk))*chunk + i % chunk.
    With chunk = bp >= rows this is one column per block, groups in ciphertexts."""

    rows: int
    cols: int
    nb: int
    bp: int
    chunk: int

    @property
    def ncc(self) -> int:
        """Complex columns (the last one is half empty when cols is odd)."""
        return (self.cols + 1) // 2

    @property
    def per_block(self) -> int:
        return self.bp // self.chunk

    @property
    def groups(self) -> int:
        return -(-self.ncc // self.nb)

    @property
    def row_chunks(self) -> int:
        return -(-self.rows // self.chunk)

    @property
    def n_ct(self) -> int:
        return -(-(self.row_chunks * self.groups) // self.per_block)

    def valid(self, slots: int) -> bool:
        """Whether a header read off the wire describes a layout of ``slots`` slots."""
        return (
            1 <= self.rows <= 1 << 24
            and 1 <= self.cols <= 1 << 24
            and _is_pow2(self.nb)
            and _is_pow2(self.bp)
            and _is_pow2(self.chunk)
            and self.nb * self.bp == slots
            and self.chunk <= self.bp
            and self.n_ct <= 1 << 16
        )

    def bases(self) -> tuple[np.ndarray, np.ndarray]:
        """(row chunk, complex column) -> ciphertext index and slot of its first row."""
        lc = np.arange(self.ncc)[None, :]
        u = np.arange(self.row_chunks)[:, None] * self.groups + lc // self.nb
        return u // self.per_block, (lc % self.nb) * self.bp + (u % self.per_block) * self.chunk

    def index(self) -> tuple[np.ndarray, np.ndarray]:
        """(rows, ncc) arrays: ciphertext and slot of every complex entry."""
        ct, base = self.bases()
        i = np.arange(self.rows)
        return ct[i // self.chunk], base[i // self.chunk] + (i % self.chunk)[:, None]

    def pack(self, x: np.ndarray, slots: int) -> np.ndarray:
        """(rows, cols) reals -> (n_ct, slots) complex slot vectors."""
        z = np.zeros((self.rows, 2 * self.ncc))
        z[:, : self.cols] = x
        out = np.zeros((self.n_ct, slots), dtype=np.complex128)
        out[self.index()] = z[:, 0::2] + 1j * z[:, 1::2]
        return out

    def unpack(self, arr: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`pack` on the data positions."""
        z = arr[self.index()]
        x = np.empty((self.rows, 2 * self.ncc))
        x[:, 0::2], x[:, 1::2] = z.real, z.imag
        return x[:, : self.cols]

    def used(self, slots: int) -> np.ndarray:
        """Boolean (n_ct, slots, 2): which real coordinates hold data."""
        m = np.zeros((self.n_ct, slots, 2), dtype=bool)
        ct, slot = self.index()
        m[ct, slot, 0] = True
        odd = np.arange(self.ncc) < self.cols // 2
        m[ct[:, odd], slot[:, odd], 1] = True
        return m


#: Largest block (rows) of the spread layout for an operand of ``tmatmul``
#: (see :func:`standard_layout`).
TMATMUL_SPREAD_ROWS = 256


def standard_layout(rows: int, cols: int, slots: int, *, tmatmul: bool = True) -> SlotLayout:
    """The key owner's layout of a (rows x cols) matrix; ``tmatmul``: whether the
    matrix is also the encrypted operand of a ``tmatmul`` (else only of ``matmul``).

    When it fits in one ciphertext: :func:`spread_layout`. Otherwise, when every
    complex column fits in one ciphertext, row chunks, one per ciphertext, each
    holding all columns in blocks of bp = slots / pow2(ncc) rows. Every
    ciphertext then has the same block structure, so ``matmul``'s diagonals are
    the same plaintexts for every chunk (encoded once whatever the batch: 32 for
    B=256 x 64 instead of 2 x 2 x 16) and ``tmatmul`` sums row chunks of fixed
    length (its cost grows linearly with the rows; on a spread layout it needs
    about rows/2 + a diagonals per ciphertext, so it grows like rows^2). A
    ``tmatmul`` operand keeps the spread layout up to TMATMUL_SPREAD_ROWS rows:
    there its ``matmul`` shares baby steps between output ciphertexts (the
    reference step: 20 key switchings instead of 28)."""
    if rows < 1 or cols < 1:
        raise ValueError(f"ckks: a {rows}x{cols} matrix does not fit blocks of {slots} slots")
    ncc = (cols + 1) // 2
    chunked = ncc * pow2(rows) > slots and pow2(ncc) <= slots // 2
    if chunked and (not tmatmul or pow2(rows) > TMATMUL_SPREAD_ROWS):
        nb = pow2(ncc)
        bp = slots // nb
        return SlotLayout(rows, cols, nb, bp, bp)
    return spread_layout(rows, cols, slots)


def spread_layout(rows: int, cols: int, slots: int) -> SlotLayout:
    """One row chunk: blocks of pow2(rows) slots, spread so the columns fill
    each ciphertext evenly (also the output of a product on such an input)."""
    if not 1 <= rows <= slots or cols < 1:
        raise ValueError(f"ckks: a {rows}x{cols} matrix does not fit blocks of {slots} slots")
    ncc = (cols + 1) // 2
    cap = slots // pow2(rows)
    n_ct = -(-ncc // cap)
    nb = pow2(-(-ncc // n_ct))
    bp = slots // nb
    return SlotLayout(rows, cols, nb, bp, bp)


@dataclass
class LinearMap:
    """out_s = sum over groups g with s_g = s of diag_a(g) * rot(in_t, delta_g)
    (+ conj(sum conj(diag_b(g)) * rot(in_t, delta_g)) when ``conj``), then for
    every k in ``fold``: out_0 += rot(out_0, k). ``diag(g)`` returns the slot
    vectors (a, b or None) of group g."""

    t: np.ndarray
    s: np.ndarray
    delta: np.ndarray  # mod slots
    diag: Callable[[int], tuple[np.ndarray, np.ndarray | None]]
    conj: bool
    out: SlotLayout
    fold: list[int] = field(default_factory=list)

    @property
    def n_out(self) -> int:
        return self.out.n_ct


def matmul_map(lin: SlotLayout, w: np.ndarray, slots: int) -> LinearMap:
    """Enc(X) -> Enc(X w) for X laid out as ``lin`` (w real, cols x m). With row
    chunks, the output keeps the input's blocks and chunks (chunk c of X gives
    chunk c of X w), so the shift between an input and an output column is the
    same in every chunk and the chunks share their diagonals."""
    r, c = lin.rows, lin.cols
    m = w.shape[1]
    lout = spread_layout(r, m, slots) if lin.row_chunks == 1 else SlotLayout(r, m, lin.nb, lin.bp, lin.chunk)
    wp = np.zeros((2 * lin.ncc, 2 * lout.ncc))
    wp[:c, :m] = w
    u, v, u2, v2 = wp[0::2, 0::2], wp[1::2, 0::2], wp[0::2, 1::2], wp[1::2, 1::2]
    # (x + i y) -> a (x + i y) + b (x - i y): the complex form of a real 2x2 block
    coef_a = (u + v2 + 1j * (u2 - v)) / 2
    coef_b = (u - v2 + 1j * (u2 + v)) / 2
    t_in, b_in = lin.bases()  # (row chunks, ncc)
    s_out, b_out = lout.bases()
    c_idx: np.ndarray
    k_idx: np.ndarray
    l_idx: np.ndarray
    c_idx, k_idx, l_idx = np.meshgrid(
        np.arange(lin.row_chunks), np.arange(lin.ncc), np.arange(lout.ncc), indexing="ij"
    )
    c_idx, k_idx, l_idx = c_idx.ravel(), k_idx.ravel(), l_idx.ravel()
    t_g, s_g = t_in[c_idx, k_idx], s_out[c_idx, l_idx]
    delta = (b_in[c_idx, k_idx] - b_out[c_idx, l_idx]) % slots
    key = (t_g * lout.n_ct + s_g) * slots + delta
    uniq, inv = np.unique(key, return_inverse=True)
    inv = inv.ravel()
    order = np.argsort(inv, kind="stable")
    members = np.split(order, np.flatnonzero(np.diff(inv[order])) + 1)
    ch = lin.chunk

    def diag(gi: int) -> tuple[np.ndarray, np.ndarray]:
        mem = members[gi]
        ks, ls, cs = k_idx[mem], l_idx[mem], c_idx[mem]
        n_rows = np.minimum(ch, r - cs * ch)  # rows of each member's chunk
        pos = np.concatenate([b_out[c, col] + np.arange(n) for c, col, n in zip(cs, ls, n_rows, strict=True)])
        da = np.zeros(slots, dtype=np.complex128)
        db = np.zeros(slots, dtype=np.complex128)
        da[pos] = np.repeat(coef_a[ks, ls], n_rows)
        db[pos] = np.repeat(coef_b[ks, ls], n_rows)
        return da, db

    return LinearMap(
        t=uniq // slots // lout.n_ct,
        s=uniq // slots % lout.n_ct,
        delta=uniq % slots,
        diag=diag,
        conj=True,
        out=lout,
    )


def tmatmul_map(p: np.ndarray, lin: SlotLayout, slots: int) -> LinearMap:
    """Enc(Y) -> Enc(p^T Y) for Y laid out as ``lin`` (p real, rows x a). Each row
    chunk of Y is a term p_c^T Y_c with the same output positions, so the chunks'
    products add up before any giant step or fold: the cost per row chunk is
    fixed, and the whole grows linearly with the rows."""
    r, m = lin.rows, lin.cols
    a = p.shape[1]
    big_a, t2 = pow2(a), pow2(lin.groups)
    rows_per = min(lin.chunk, r)  # rows of a full input chunk
    n_part, stride, length = 1, 0, rows_per
    # Keep the input's block stride and put the a-vector of column group t in
    # chunk t (or, when a > bp, row chunk c of it in ciphertext c*T + t): the
    # shift of the term (i, alpha) is then i - alpha - t*A, the same in every block.
    lout = SlotLayout(a, m, lin.nb, lin.bp, min(big_a, lin.bp))
    if t2 * big_a <= lin.bp:
        # spare chunks: split the rows into n_part slices summed into chunks
        # t + h*t2 and folded at the end; the slices share their diagonals
        stride = t2 * big_a
        n_part = pow2(-(-rows_per // stride))
        length = stride if n_part > 1 else rows_per
    t_in, b_in = lin.bases()  # (input row chunks, ncc)
    s_out, b_out = lout.bases()  # (output row chunks, ncc)
    ch = lout.chunk
    # (input chunk, output row chunk, column) triples with the same (t, s, base
    # offset) share every diagonal
    ic: np.ndarray
    rc: np.ndarray
    lc: np.ndarray
    ic, rc, lc = np.meshgrid(
        np.arange(lin.row_chunks), np.arange(lout.row_chunks), np.arange(lin.ncc), indexing="ij"
    )
    ic, rc, lc = ic.ravel(), rc.ravel(), lc.ravel()
    cls_key = np.stack([t_in[ic, lc], s_out[rc, lc], (b_in[ic, lc] - b_out[rc, lc]) % slots, rc, ic], axis=1)
    cls, cls_inv = np.unique(cls_key, axis=0, return_inverse=True)
    cls_inv = cls_inv.ravel()
    offs = np.arange(-(ch - 1), length)  # e = i - alpha' within a slice (alpha' < chunk)
    order = np.argsort(cls_inv, kind="stable")
    members = np.split(order, np.flatnonzero(np.diff(cls_inv[order])) + 1)

    def diag(gi: int) -> tuple[np.ndarray, None]:
        ci, k = divmod(gi, len(offs))
        e, c, i_c = int(offs[k]), int(cls[ci, 3]), int(cls[ci, 4])
        base = b_out[rc[members[ci]], lc[members[ci]]]
        rows_c = min(ch, a - c * ch)
        r0 = i_c * lin.chunk  # first row of this input chunk
        r_in = min(lin.chunk, r - r0)
        dg = np.zeros(slots)
        for h in range(n_part):
            top = min(rows_c, length - e, r_in - h * length - e)
            al = np.arange(max(0, -e), top)
            if len(al) == 0:
                continue
            vals = p[r0 + h * length + al + e, c * ch + al]
            dg[(base[:, None] + h * stride + al[None, :]).ravel()] = np.tile(vals, len(base))
        return dg, None

    fold = []
    h = n_part // 2
    while h >= 1:  # chunk t += chunk t + h*t2; garbage lands only in spare chunks
        fold.append(h * stride)
        h //= 2
    return LinearMap(
        t=np.repeat(cls[:, 0], len(offs)),
        s=np.repeat(cls[:, 1], len(offs)),
        delta=(np.repeat(cls[:, 2], len(offs)) + np.tile(offs, len(cls))) % slots,
        diag=diag,
        conj=False,
        out=lout,
        fold=fold if n_part > 1 else [],
    )


def simulate(lmap: LinearMap, packed: np.ndarray) -> np.ndarray:
    """Evaluate ``lmap`` on cleartext slot vectors (n_in, slots) with numpy:
    the reference for the kernels (rot(v, k) = np.roll(v, -k))."""
    slots = packed.shape[1]
    out = np.zeros((lmap.n_out, slots), dtype=np.complex128)
    for g in range(len(lmap.t)):
        src = np.roll(packed[int(lmap.t[g])], -int(lmap.delta[g]))
        da, db = lmap.diag(g)
        out[int(lmap.s[g])] += da * src
        if db is not None:
            out[int(lmap.s[g])] += db * np.conj(src)
    for k in lmap.fold:
        out[0] += np.roll(out[0], -k)
    return out
