//! The two unit formats manifests use: sizes (`512Mi`) and durations (`5m`, `1h30m`).
//!
//! Both may also be written as bare integers (bytes, seconds). The schema checks the shape; these
//! functions give the numbers to whoever enforces them (the dispatcher's limits, timeouts).

use std::time::Duration;

use serde_json::Value;

/// A size in bytes: a positive integer, or a positive integer with `Ki`, `Mi`, `Gi` or `Ti`.
pub fn parse_quantity(value: &Value) -> Option<u64> {
    if let Some(n) = value.as_u64() {
        return (n > 0).then_some(n);
    }
    let text = value.as_str()?;
    let (digits, factor) = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
    ]
    .iter()
    .find_map(|(suffix, factor)| text.strip_suffix(suffix).map(|d| (d, *factor)))
    .unwrap_or((text, 1));
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits
        .parse::<u64>()
        .ok()
        .filter(|n| *n > 0)?
        .checked_mul(factor)
}

/// A duration: a positive integer of seconds, or number+unit groups (`ms`, `s`, `m`, `h`, `d`).
pub fn parse_duration(value: &Value) -> Option<Duration> {
    if let Some(n) = value.as_u64() {
        return (n > 0).then(|| Duration::from_secs(n));
    }
    let text = value.as_str()?;
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse::<u64>()
            .ok()
            .filter(|n| *n > 0)
            .map(Duration::from_secs);
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits_end = rest.find(|c: char| !c.is_ascii_digit())?;
        if digits_end == 0 {
            return None;
        }
        let number: u64 = rest[..digits_end].parse().ok()?;
        rest = &rest[digits_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let millis_per_unit: u64 = match &rest[..unit_end] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return None,
        };
        rest = &rest[unit_end..];
        total = total.checked_add(Duration::from_millis(number.checked_mul(millis_per_unit)?))?;
    }
    (!total.is_zero()).then_some(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity(&json!("512Mi")), Some(512 << 20));
        assert_eq!(parse_quantity(&json!("1Gi")), Some(1 << 30));
        assert_eq!(parse_quantity(&json!(4096)), Some(4096));
        assert_eq!(parse_quantity(&json!("4096")), Some(4096));
        assert_eq!(parse_quantity(&json!("0Mi")), None);
        assert_eq!(parse_quantity(&json!("1.5Gi")), None);
        assert_eq!(parse_quantity(&json!("99999999999Ti")), None);
    }

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration(&json!("600s")),
            Some(Duration::from_secs(600))
        );
        assert_eq!(
            parse_duration(&json!("1h30m")),
            Some(Duration::from_secs(5400))
        );
        assert_eq!(
            parse_duration(&json!("250ms")),
            Some(Duration::from_millis(250))
        );
        assert_eq!(parse_duration(&json!(30)), Some(Duration::from_secs(30)));
        assert_eq!(parse_duration(&json!("30")), Some(Duration::from_secs(30)));
        assert_eq!(parse_duration(&json!("5x")), None);
        assert_eq!(parse_duration(&json!("m")), None);
        assert_eq!(parse_duration(&json!("0s")), None);
    }
}
