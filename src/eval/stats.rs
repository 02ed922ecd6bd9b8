//! Paired significance testing: the two-tailed paired t-test (Student's t distribution through the
//! regularized incomplete beta function).

/// Two-tailed p-value of the paired t-test on `b - a` (same length, paired by position). `None` with fewer
/// than two pairs; 1 when every difference is zero.
pub fn paired_t_test(a: &[f64], b: &[f64]) -> Option<f64> {
    let n = a.len().min(b.len());
    if n < 2 {
        return None;
    }
    let diffs: Vec<f64> = a.iter().zip(b).map(|(x, y)| y - x).collect();
    let mean = diffs.iter().sum::<f64>() / n as f64;
    let var = diffs.iter().map(|d| (d - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    if var == 0.0 {
        return Some(if mean == 0.0 { 1.0 } else { 0.0 });
    }
    let t = mean / (var / n as f64).sqrt();
    let df = (n - 1) as f64;
    Some(regularized_incomplete_beta(df / (df + t * t), df / 2.0, 0.5))
}

/// I_x(a, b), by the continued fraction of Numerical Recipes (Lentz's method).
pub fn regularized_incomplete_beta(x: f64, a: f64, b: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let front = (ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln()).exp();
    if x < (a + 1.0) / (a + b + 2.0) {
        front * beta_fraction(x, a, b) / a
    } else {
        1.0 - front * beta_fraction(1.0 - x, b, a) / b
    }
}

fn beta_fraction(x: f64, a: f64, b: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let mut c = 1.0;
    let mut d = 1.0 - (a + b) * x / (a + 1.0);
    if d.abs() < TINY {
        d = TINY;
    }
    d = 1.0 / d;
    let mut h = d;
    for m in 1..500 {
        let m = m as f64;
        let num = m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m));
        d = 1.0 + num * d;
        d = if d.abs() < TINY { TINY } else { d };
        c = 1.0 + num / c;
        c = if c.abs() < TINY { TINY } else { c };
        d = 1.0 / d;
        h *= d * c;
        let num = -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0));
        d = 1.0 + num * d;
        d = if d.abs() < TINY { TINY } else { d };
        c = 1.0 + num / c;
        c = if c.abs() < TINY { TINY } else { c };
        d = 1.0 / d;
        let delta = d * c;
        h *= delta;
        if (delta - 1.0).abs() < 1e-15 {
            break;
        }
    }
    h
}

/// ln Γ(x) for x > 0 (Lanczos, g = 7, n = 9).
fn ln_gamma(x: f64) -> f64 {
    const G: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut sum = G[0];
    for (i, g) in G.iter().enumerate().skip(1) {
        sum += g / (x + i as f64);
    }
    let t = x + 7.5;
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + sum.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_scipy_ttest_rel() {
        // scipy.stats.ttest_rel([1,2,3,4,5], [1.5,2.1,3.9,4.2,6.0]).pvalue == 0.040306920594900035
        let p = paired_t_test(&[1.0, 2.0, 3.0, 4.0, 5.0], &[1.5, 2.1, 3.9, 4.2, 6.0]).unwrap();
        assert!((p - 0.040_306_920_594_900_035).abs() < 1e-9, "{p}");
        assert_eq!(paired_t_test(&[1.0, 2.0], &[1.0, 2.0]), Some(1.0));
        assert_eq!(paired_t_test(&[1.0], &[2.0]), None);
    }

    #[test]
    fn incomplete_beta_known_values() {
        assert!((regularized_incomplete_beta(0.5, 2.0, 2.0) - 0.5).abs() < 1e-12);
        assert!((regularized_incomplete_beta(0.2, 1.0, 1.0) - 0.2).abs() < 1e-12);
        assert!((ln_gamma(5.0) - 24f64.ln()).abs() < 1e-12);
    }
}
