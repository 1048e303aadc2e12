//! `skinny_matmul`: y = x W^T for the few rows of a verification pass.
//!
//! A tree of 1-16 tokens multiplies each weight matrix by a handful of rows, so the pass is
//! bound by streaming the weights from memory, not by arithmetic: BLAS kernels built for large
//! products leave much of the bandwidth unused there (SmolLM2-135M, 2-core VM: torch's product
//! over all 538 MB of linear weights took 49-60 ms for 1-4 rows, 80-98 ms for 8-16, where
//! reading them once takes 28 ms). This kernel reads each weight once per call: a block of
//! BLOCK weight rows stays in L1 while every input row passes over it.

use crate::error::{Error, Result};

/// Weight rows multiplied together (their accumulators stay in registers).
const BLOCK: usize = 4;

/// Whether this CPU runs the vectorised kernel (x86-64 with AVX2 and FMA); elsewhere a
/// portable loop runs, correct but several times slower than a BLAS product.
pub fn skinny_is_vectorised() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Checks the shapes and writes y [n, rows] = x [n, cols] W^T, W [rows, cols], all row-major,
/// splitting the weight rows over up to `threads` threads.
pub fn skinny_matmul(
    w: &[f32],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    threads: usize,
) -> Result<()> {
    let check = |name: &'static str, got: usize, a: usize, b: usize| {
        if a.checked_mul(b) == Some(got) {
            Ok(())
        } else {
            Err(Error::shape(
                name,
                format!("{a} x {b} elements"),
                format!("{got} elements"),
            ))
        }
    };
    check("w", w.len(), rows, cols)?;
    check("x", x.len(), n, cols)?;
    check("y", y.len(), n, rows)?;
    if rows == 0 || n == 0 {
        return Ok(());
    }
    let op = Operands {
        w,
        x,
        y: y.as_mut_ptr(),
        rows,
        cols,
        n,
    };
    let parts = threads.clamp(1, rows.div_ceil(BLOCK));
    if parts == 1 {
        band(&op, 0, rows);
        return Ok(());
    }
    let per = rows.div_ceil(BLOCK).div_ceil(parts) * BLOCK;
    crate::pool::run_parts(parts, &|i| {
        let (r0, r1) = (i * per, ((i + 1) * per).min(rows));
        if r0 < r1 {
            band(&op, r0, r1);
        }
    });
    Ok(())
}

/// One product's operands, checked: W [rows, cols] and x [n, cols] read, y [n, rows] written
/// through a pointer, since each thread's band writes its own columns of every row of y.
struct Operands<'a> {
    w: &'a [f32],
    x: &'a [f32],
    y: *mut f32,
    rows: usize,
    cols: usize,
    n: usize,
}

// SAFETY: w and x are only read; the bands that share an Operands write disjoint columns of y,
// which `skinny_matmul` borrows mutably until every band has returned.
unsafe impl Sync for Operands<'_> {}

/// Columns r0..r1 of y (weight rows r0..r1).
fn band(op: &Operands<'_>, r0: usize, r1: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if skinny_is_vectorised() {
            // SAFETY: the features were just detected.
            unsafe { avx2::band(op, r0, r1) };
            return;
        }
    }
    portable_band(op, r0, r1);
}

fn portable_band(op: &Operands<'_>, r0: usize, r1: usize) {
    let cols = op.cols;
    for r in r0..r1 {
        let wr = &op.w[r * cols..(r + 1) * cols];
        for j in 0..op.n {
            let xj = &op.x[j * cols..(j + 1) * cols];
            // SAFETY: j < n and r < rows index y's n * rows elements; column r is this band's.
            unsafe { *op.y.add(j * op.rows + r) = wr.iter().zip(xj).map(|(a, b)| a * b).sum() };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{Operands, BLOCK};

    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    /// BLOCK weight rows against C input rows; the columns past the last multiple of 8 in scalar.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)] // register tiles: indices read best
    unsafe fn tile<const C: usize>(
        w: *const f32,
        cols: usize,
        x: *const f32,
        y: *mut f32,
        rows: usize,
        r: usize,
        j: usize,
    ) {
        let mut acc = [[_mm256_setzero_ps(); C]; BLOCK];
        let body = cols - cols % 8;
        let mut k = 0;
        while k < body {
            let wv: [__m256; BLOCK] = std::array::from_fn(|b| _mm256_loadu_ps(w.add(b * cols + k)));
            for c in 0..C {
                let xv = _mm256_loadu_ps(x.add((j + c) * cols + k));
                for b in 0..BLOCK {
                    acc[b][c] = _mm256_fmadd_ps(wv[b], xv, acc[b][c]);
                }
            }
            k += 8;
        }
        for b in 0..BLOCK {
            for c in 0..C {
                let mut s = hsum(acc[b][c]);
                for kk in body..cols {
                    s += *w.add(b * cols + kk) * *x.add((j + c) * cols + kk);
                }
                *y.add((j + c) * rows + r + b) = s;
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn band(op: &Operands<'_>, r0: usize, r1: usize) {
        let (cols, rows, n) = (op.cols, op.rows, op.n);
        let (xp, yp) = (op.x.as_ptr(), op.y);
        let mut r = r0;
        while r + BLOCK <= r1 {
            let wp = op.w.as_ptr().add(r * cols);
            let mut j = 0;
            while j + 2 <= n {
                tile::<2>(wp, cols, xp, yp, rows, r, j);
                j += 2;
            }
            if j < n {
                tile::<1>(wp, cols, xp, yp, rows, r, j);
            }
            r += BLOCK;
        }
        if r < r1 {
            super::portable_band(op, r, r1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(w: &[f32], rows: usize, cols: usize, x: &[f32], n: usize) -> Vec<f64> {
        let mut y = vec![0.0; n * rows];
        for j in 0..n {
            for r in 0..rows {
                y[j * rows + r] = (0..cols)
                    .map(|k| w[r * cols + k] as f64 * x[j * cols + k] as f64)
                    .sum();
            }
        }
        y
    }

    #[test]
    fn matches_a_double_precision_product_at_every_shape_and_thread_count() {
        let mut seed = 7u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        for &(rows, cols, n) in &[
            (1, 1, 1),
            (4, 8, 1),
            (7, 13, 3),
            (16, 24, 5),
            (9, 40, 2),
            (33, 17, 8),
        ] {
            let w: Vec<f32> = (0..rows * cols).map(|_| next()).collect();
            let x: Vec<f32> = (0..n * cols).map(|_| next()).collect();
            let want = reference(&w, rows, cols, &x, n);
            for threads in 1..=3 {
                let mut y = vec![f32::NAN; n * rows];
                skinny_matmul(&w, rows, cols, &x, n, &mut y, threads).unwrap();
                for (a, b) in y.iter().zip(&want) {
                    assert!(
                        (*a as f64 - b).abs() < 1e-4,
                        "{rows}x{cols} n={n} t={threads}: {a} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn wrong_lengths_are_errors() {
        let mut y = vec![0.0; 2];
        assert!(skinny_matmul(&[0.0; 6], 2, 3, &[0.0; 3], 1, &mut y, 1).is_ok());
        assert!(skinny_matmul(&[0.0; 5], 2, 3, &[0.0; 3], 1, &mut y, 1).is_err());
        assert!(skinny_matmul(&[0.0; 6], 2, 3, &[0.0; 4], 1, &mut y, 1).is_err());
        assert!(skinny_matmul(&[0.0; 6], 2, 3, &[0.0; 3], 1, &mut [0.0; 3], 1).is_err());
    }
}
