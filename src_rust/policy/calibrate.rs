//! Online calibration of the cost coefficients from timings workers report.
//!
//! Each timing is a linear observation `ms = x · θ`. We keep exponentially
//! weighted normal equations (XᵀX, Xᵀy), so old hardware behaviour fades, and
//! refit after every sample. A fit is only used once enough samples span the
//! features and every coefficient comes out non-negative; until then the
//! defaults stand.

use super::cost::Coefficients;

/// Exponentially weighted least squares over N features.
#[derive(Clone, Debug)]
struct Fit<const N: usize> {
    xtx: [[f64; N]; N],
    xty: [f64; N],
    samples: u64,
}

impl<const N: usize> Fit<N> {
    fn new() -> Self {
        Fit {
            xtx: [[0.0; N]; N],
            xty: [0.0; N],
            samples: 0,
        }
    }

    fn add(&mut self, x: [f64; N], y: f64, alpha: f64) {
        let keep = 1.0 - alpha;
        for i in 0..N {
            for j in 0..N {
                self.xtx[i][j] = keep * self.xtx[i][j] + alpha * x[i] * x[j];
            }
            self.xty[i] = keep * self.xty[i] + alpha * x[i] * y;
        }
        self.samples += 1;
    }

    /// Solves the normal equations by Gaussian elimination with partial
    /// pivoting; None when singular or any coefficient is negative.
    fn solve(&self) -> Option<[f64; N]> {
        if self.samples < 2 * N as u64 {
            return None;
        }
        let mut a = self.xtx;
        let mut b = self.xty;
        for col in 0..N {
            let pivot = (col..N).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
            let scale = a.iter().flatten().fold(0.0f64, |m, v| m.max(v.abs()));
            if a[pivot][col].abs() <= 1e-12 * scale {
                return None;
            }
            a.swap(col, pivot);
            b.swap(col, pivot);
            let pivot_row = a[col];
            for row in col + 1..N {
                let f = a[row][col] / pivot_row[col];
                for (v, p) in a[row].iter_mut().zip(pivot_row).skip(col) {
                    *v -= f * p;
                }
                b[row] -= f * b[col];
            }
        }
        let mut x = [0.0; N];
        for row in (0..N).rev() {
            let tail: f64 = (row + 1..N).map(|k| a[row][k] * x[k]).sum();
            x[row] = (b[row] - tail) / a[row][row];
        }
        x.iter().all(|v| v.is_finite() && *v >= 0.0).then_some(x)
    }
}

/// Keeps the coefficients in step with what workers measure.
#[derive(Clone, Debug)]
pub struct Calibrator {
    alpha: f64,
    /// ms = base + per_token · n + attention · n (p + n/2)
    prefill: Fit<3>,
    /// step ms = base + per_block · active blocks
    decode: Fit<2>,
    /// ms = per_block · blocks
    transfer: Fit<1>,
}

impl Calibrator {
    pub fn new(alpha: f64) -> Self {
        Calibrator {
            alpha,
            prefill: Fit::new(),
            decode: Fit::new(),
            transfer: Fit::new(),
        }
    }

    /// A prefill of `new_tokens` after `cached_tokens` took `ms`.
    pub fn observe_prefill(
        &mut self,
        coeffs: &mut Coefficients,
        new_tokens: f64,
        cached_tokens: f64,
        ms: f64,
    ) {
        let attention = new_tokens * (cached_tokens + new_tokens / 2.0);
        self.prefill
            .add([1.0, new_tokens, attention], ms, self.alpha);
        if let Some([base, per_token, attention]) = self.prefill.solve() {
            coeffs.prefill_base_ms = base;
            coeffs.prefill_ms_per_token = per_token;
            coeffs.attention_ms_per_token2 = attention;
        }
    }

    /// A decode step over `active_blocks` KV blocks took `ms`.
    pub fn observe_decode_step(&mut self, coeffs: &mut Coefficients, active_blocks: f64, ms: f64) {
        self.decode.add([1.0, active_blocks], ms, self.alpha);
        if let Some([_, per_block]) = self.decode.solve() {
            coeffs.decode_ms_per_block = per_block;
        }
    }

    /// Moving `blocks` blocks between workers took `ms`.
    pub fn observe_transfer(&mut self, coeffs: &mut Coefficients, blocks: f64, ms: f64) {
        self.transfer.add([blocks], ms, self.alpha);
        if let Some([per_block]) = self.transfer.solve() {
            coeffs.transfer_ms_per_block = per_block;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_the_prefill_model_from_samples() {
        let truth = Coefficients {
            prefill_base_ms: 5.0,
            prefill_ms_per_token: 0.04,
            attention_ms_per_token2: 2e-8,
            ..Coefficients::default()
        };
        let mut coeffs = Coefficients::default();
        let mut calibrator = Calibrator::new(0.1);
        for i in 0..200u32 {
            let new = f64::from(100 + (i * 7919) % 20_000);
            let cached = f64::from((i * 104_729) % 30_000);
            calibrator.observe_prefill(&mut coeffs, new, cached, truth.prefill_ms(new, cached));
        }
        assert!((coeffs.prefill_base_ms - 5.0).abs() < 1e-3);
        assert!((coeffs.prefill_ms_per_token - 0.04).abs() < 1e-6);
        assert!((coeffs.attention_ms_per_token2 - 2e-8).abs() < 1e-11);
    }

    #[test]
    fn keeps_defaults_until_samples_span_the_features() {
        let mut coeffs = Coefficients::default();
        let mut calibrator = Calibrator::new(0.1);
        for _ in 0..10 {
            calibrator.observe_prefill(&mut coeffs, 1000.0, 0.0, 30.0);
        }
        assert_eq!(coeffs, Coefficients::default());
    }

    #[test]
    fn fits_decode_and_transfer() {
        let mut coeffs = Coefficients::default();
        let mut calibrator = Calibrator::new(0.2);
        for blocks in 1..20 {
            let b = f64::from(blocks * 500);
            calibrator.observe_decode_step(&mut coeffs, b, 6.0 + 0.001 * b);
            calibrator.observe_transfer(&mut coeffs, b, 0.3 * b);
        }
        assert!((coeffs.decode_ms_per_block - 0.001).abs() < 1e-9);
        assert!((coeffs.transfer_ms_per_block - 0.3).abs() < 1e-9);
    }
}
