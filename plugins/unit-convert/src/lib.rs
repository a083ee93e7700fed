//! Unit conversion for length, mass, time, data size and temperature.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use toolhost_sdk::{Context, Tool, ToolError, export_tools};

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The quantity to convert.
    value: f64,
    /// The unit of `value`, e.g. "km", "lb", "h", "MiB", "degF".
    from: String,
    /// The unit to convert to, of the same kind as `from`.
    to: String,
}

#[derive(Serialize)]
struct Converted {
    value: f64,
    unit: String,
    kind: &'static str,
}

/// (unit, kind, factor to the kind's base unit). Temperature is affine and handled apart.
const UNITS: &[(&str, &str, f64)] = &[
    ("mm", "length", 0.001),
    ("cm", "length", 0.01),
    ("m", "length", 1.0),
    ("km", "length", 1000.0),
    ("in", "length", 0.0254),
    ("ft", "length", 0.3048),
    ("yd", "length", 0.9144),
    ("mi", "length", 1609.344),
    ("mg", "mass", 1e-6),
    ("g", "mass", 0.001),
    ("kg", "mass", 1.0),
    ("t", "mass", 1000.0),
    ("oz", "mass", 0.028349523125),
    ("lb", "mass", 0.45359237),
    ("ms", "time", 0.001),
    ("s", "time", 1.0),
    ("min", "time", 60.0),
    ("h", "time", 3600.0),
    ("d", "time", 86400.0),
    ("B", "data", 1.0),
    ("KB", "data", 1e3),
    ("MB", "data", 1e6),
    ("GB", "data", 1e9),
    ("KiB", "data", 1024.0),
    ("MiB", "data", 1048576.0),
    ("GiB", "data", 1073741824.0),
];

fn to_kelvin(value: f64, unit: &str) -> Option<f64> {
    match unit {
        "K" => Some(value),
        "degC" => Some(value + 273.15),
        "degF" => Some((value - 32.0) * 5.0 / 9.0 + 273.15),
        _ => None,
    }
}

fn from_kelvin(kelvin: f64, unit: &str) -> Option<f64> {
    match unit {
        "K" => Some(kelvin),
        "degC" => Some(kelvin - 273.15),
        "degF" => Some((kelvin - 273.15) * 9.0 / 5.0 + 32.0),
        _ => None,
    }
}

fn lookup(unit: &str) -> Option<(&'static str, f64)> {
    UNITS
        .iter()
        .find(|(name, _, _)| *name == unit)
        .map(|&(_, kind, factor)| (kind, factor))
}

fn convert_units(args: Args, _ctx: &Context) -> Result<Converted, ToolError> {
    let Args { value, from, to } = args;
    if let (Some(kelvin), Some(_)) = (to_kelvin(value, &from), to_kelvin(0.0, &to)) {
        let converted = from_kelvin(kelvin, &to).expect("checked above");
        return Ok(Converted {
            value: round(converted),
            unit: to,
            kind: "temperature",
        });
    }
    let known = || {
        let mut names: Vec<&str> = UNITS.iter().map(|u| u.0).collect();
        names.extend(["K", "degC", "degF"]);
        names.join(", ")
    };
    let (from_kind, from_factor) = lookup(&from).ok_or_else(|| {
        ToolError::invalid_args(format!("unknown unit `{from}`; known: {}", known()))
    })?;
    let (to_kind, to_factor) = lookup(&to).ok_or_else(|| {
        ToolError::invalid_args(format!("unknown unit `{to}`; known: {}", known()))
    })?;
    if from_kind != to_kind {
        return Err(ToolError::invalid_args(format!(
            "cannot convert {from_kind} (`{from}`) to {to_kind} (`{to}`)"
        )));
    }
    Ok(Converted {
        value: round(value * from_factor / to_factor),
        unit: to,
        kind: from_kind,
    })
}

/// Twelve significant digits: enough for any real use, and hides binary-float noise.
fn round(value: f64) -> f64 {
    format!("{value:.12e}").parse().unwrap_or(value)
}

export_tools!(
    Tool::new(
        "convert_units",
        "Converts a quantity between units of length (mm, cm, m, km, in, ft, yd, mi), mass (mg, g, kg, t, oz, lb), time (ms, s, min, h, d), data size (B, KB, MB, GB, KiB, MiB, GiB) and temperature (K, degC, degF).",
        convert_units,
    )
    .strict(),
);
