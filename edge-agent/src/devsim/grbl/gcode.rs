//! Parsing one G-code line into the words GRBL acts on, with GRBL 1.1's
//! error numbers.

/// `error:1` — a word did not start with a letter.
pub const ERR_EXPECTED_LETTER: u8 = 1;
/// `error:2` — a number was missing or malformed.
pub const ERR_BAD_NUMBER: u8 = 2;
/// `error:3` — unknown or unsupported `$` command.
pub const ERR_INVALID_STATEMENT: u8 = 3;
/// `error:4` — negative value where a positive one is required (F, P).
pub const ERR_NEGATIVE_VALUE: u8 = 4;
/// `error:5` — `$H` with homing disabled (`$22=0`).
pub const ERR_HOMING_DISABLED: u8 = 5;
/// `error:8` — `$` command while moving.
pub const ERR_IDLE_ERROR: u8 = 8;
/// `error:9` — G-code or jog locked out in the alarm state.
pub const ERR_SYSTEM_GC_LOCK: u8 = 9;
/// `error:14` — line longer than 80 characters.
pub const ERR_OVERFLOW: u8 = 14;
/// `error:15` — jog target outside the travel.
pub const ERR_TRAVEL_EXCEEDED: u8 = 15;
/// `error:16` — malformed jog command.
pub const ERR_INVALID_JOG: u8 = 16;
/// `error:20` — unsupported G/M code or word.
pub const ERR_UNSUPPORTED_COMMAND: u8 = 20;
/// `error:21` — two commands of the same modal group.
pub const ERR_MODAL_GROUP_VIOLATION: u8 = 21;
/// `error:22` — G1 with no feed rate set.
pub const ERR_UNDEFINED_FEED_RATE: u8 = 22;
/// `error:25` — the same word twice in a line.
pub const ERR_WORD_REPEATED: u8 = 25;
/// `error:28` — G4 without its P word.
pub const ERR_VALUE_WORD_MISSING: u8 = 28;

/// Longest line GRBL 1.1 accepts (after spaces are removed).
pub const LINE_MAX: usize = 80;

/// Motion mode (modal group 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Motion {
    /// G0: rapid at the axes' maximum rates.
    Rapid,
    /// G1: linear at the programmed feed rate.
    Linear,
}

/// The words of one line that the simulator acts on.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Block {
    /// G0 / G1 in this line.
    pub motion: Option<Motion>,
    /// G4 in this line.
    pub dwell: bool,
    /// G90 (`Some(true)`) / G91 (`Some(false)`).
    pub absolute: Option<bool>,
    /// G20 (`Some(true)`) / G21 (`Some(false)`).
    pub inches: Option<bool>,
    /// G53: this move is in machine coordinates (same as work ones here).
    pub machine_coords: bool,
    /// X, Y, Z values as written (mm or inch, absolute or relative).
    pub axes: [Option<f64>; 3],
    /// F, in mm/min (or inch/min under G20).
    pub feed: Option<f64>,
    /// P, G4 dwell in seconds.
    pub p: Option<f64>,
}

impl Block {
    /// Whether any of X, Y, Z was given.
    pub fn has_axes(&self) -> bool {
        self.axes.iter().any(Option::is_some)
    }
}

/// Removes spaces, `(comments)` and `; comments`, upper-cases the rest.
pub fn clean_line(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut in_paren = false;
    for c in raw.chars() {
        match c {
            '(' => in_paren = true,
            ')' => in_paren = false,
            ';' if !in_paren => break,
            _ if in_paren || c.is_whitespace() || c.is_control() => {}
            _ => out.push(c.to_ascii_uppercase()),
        }
    }
    out
}

/// Parses a cleaned line (see [`clean_line`]) into a [`Block`].
///
/// Errors: a GRBL error number (`ERR_*`).
pub fn parse_block(line: &str) -> Result<Block, u8> {
    let mut block = Block::default();
    let mut seen = Vec::new();
    let mut rest = line;
    while let Some(letter) = rest.chars().next() {
        if !letter.is_ascii_uppercase() {
            return Err(ERR_EXPECTED_LETTER);
        }
        rest = &rest[letter.len_utf8()..];
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
            .unwrap_or(rest.len());
        let value: f64 = rest[..end].parse().map_err(|_| ERR_BAD_NUMBER)?;
        rest = &rest[end..];
        match letter {
            'G' => apply_g(&mut block, value)?,
            'M' => apply_m(value)?,
            'X' | 'Y' | 'Z' | 'F' | 'P' => {
                if seen.contains(&letter) {
                    return Err(ERR_WORD_REPEATED);
                }
                seen.push(letter);
                match letter {
                    'X' => block.axes[0] = Some(value),
                    'Y' => block.axes[1] = Some(value),
                    'Z' => block.axes[2] = Some(value),
                    'F' if value < 0.0 => return Err(ERR_NEGATIVE_VALUE),
                    'F' => block.feed = Some(value),
                    _ if value < 0.0 => return Err(ERR_NEGATIVE_VALUE),
                    _ => block.p = Some(value),
                }
            }
            // Line number, spindle speed and tool number change nothing here.
            'N' | 'S' | 'T' => {}
            _ => return Err(ERR_UNSUPPORTED_COMMAND),
        }
    }
    if block.dwell && block.p.is_none() {
        return Err(ERR_VALUE_WORD_MISSING);
    }
    if block.dwell && (block.motion.is_some() || block.has_axes()) {
        return Err(ERR_UNSUPPORTED_COMMAND);
    }
    Ok(block)
}

fn apply_g(block: &mut Block, value: f64) -> Result<(), u8> {
    // G codes are integers here (no G38.2, G90.1 …).
    if value.fract() != 0.0 {
        return Err(ERR_UNSUPPORTED_COMMAND);
    }
    match value as i64 {
        0 => set(&mut block.motion, Motion::Rapid),
        1 => set(&mut block.motion, Motion::Linear),
        4 => {
            block.dwell = true;
            Ok(())
        }
        20 => set(&mut block.inches, true),
        21 => set(&mut block.inches, false),
        90 => set(&mut block.absolute, true),
        91 => set(&mut block.absolute, false),
        53 => {
            block.machine_coords = true;
            Ok(())
        }
        // XY plane, feed per minute, work coordinate system 1: the defaults.
        17 | 54 | 94 => Ok(()),
        _ => Err(ERR_UNSUPPORTED_COMMAND),
    }
}

/// Sets a modal-group slot once per line.
fn set<T>(slot: &mut Option<T>, v: T) -> Result<(), u8> {
    if slot.is_some() {
        return Err(ERR_MODAL_GROUP_VIOLATION);
    }
    *slot = Some(v);
    Ok(())
}

fn apply_m(value: f64) -> Result<(), u8> {
    match value {
        // Program pause/end, spindle and coolant: nothing to simulate.
        v if [0.0, 1.0, 2.0, 30.0, 3.0, 4.0, 5.0, 7.0, 8.0, 9.0].contains(&v) => Ok(()),
        _ => Err(ERR_UNSUPPORTED_COMMAND),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_linear_move_line_parses_into_axes_and_feed() {
        let b = parse_block(&clean_line("g1 x10.5 Y-2 (comment) F1500 ; tail")).unwrap();
        assert_eq!(b.motion, Some(Motion::Linear));
        assert_eq!(b.axes, [Some(10.5), Some(-2.0), None]);
        assert_eq!(b.feed, Some(1500.0));
    }

    #[test]
    fn malformed_lines_get_grbl_error_numbers() {
        assert_eq!(parse_block("G1X1..2"), Err(ERR_BAD_NUMBER));
        assert_eq!(parse_block("G1X"), Err(ERR_BAD_NUMBER));
        assert_eq!(parse_block("1X2"), Err(ERR_EXPECTED_LETTER));
        assert_eq!(parse_block("G2X1"), Err(ERR_UNSUPPORTED_COMMAND));
        assert_eq!(parse_block("G0G1X1"), Err(ERR_MODAL_GROUP_VIOLATION));
        assert_eq!(parse_block("G1X1X2"), Err(ERR_WORD_REPEATED));
        assert_eq!(parse_block("G4"), Err(ERR_VALUE_WORD_MISSING));
        assert_eq!(parse_block("G1F-5"), Err(ERR_NEGATIVE_VALUE));
    }
}
