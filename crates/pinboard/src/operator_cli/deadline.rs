//! Deadlines as operators type them: `30s`, `500ms`, `2m`, `1h`, or a bare
//! number of seconds; `none` for no deadline where one may be absent.
//!
//! Owns the parsing only; the one-year ceiling is pinboard's to enforce
//! (it answers 400, which the command reports).

/// Seconds of `text`, or `None` for `none`.
///
/// # Errors
///
/// A one-line reason when `text` is not a non-negative duration.
pub fn parse_deadline(text: &str) -> Result<Option<f64>, String> {
    let t = text.trim();
    if t.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    let (number, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (t, 1.0)
    };
    match number.trim().parse::<f64>() {
        Ok(n) if n.is_finite() && n >= 0.0 => Ok(Some(n * scale)),
        _ => Err(format!(
            "deadline {text:?} is not a duration (30s, 500ms, 2m, 1h, seconds, or none)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_refusals() {
        assert_eq!(parse_deadline("30s"), Ok(Some(30.0)));
        assert_eq!(parse_deadline("1500ms"), Ok(Some(1.5)));
        assert_eq!(parse_deadline("2m"), Ok(Some(120.0)));
        assert_eq!(parse_deadline("1h"), Ok(Some(3600.0)));
        assert_eq!(parse_deadline("7"), Ok(Some(7.0)));
        assert_eq!(parse_deadline("none"), Ok(None));
        for bad in ["", "-1s", "soon", "inf", "NaN", "1d"] {
            assert!(parse_deadline(bad).is_err(), "{bad:?}");
        }
    }
}
