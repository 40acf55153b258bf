//! Tables as aligned monospace grids, and the display width that aligns them.

use super::ir::Alignment;

/// Tables wider than this many display columns are laid out as records
/// (`Header: value` lines) instead of an aligned monospace grid: a wider grid wraps on a
/// phone and becomes unreadable.
pub const TABLE_MAX_WIDTH: usize = 60;

/// The table as an aligned grid, or `None` when wider than [`TABLE_MAX_WIDTH`].
pub(crate) fn aligned(alignments: &[Alignment], grid: &[Vec<String>]) -> Option<String> {
    let columns = grid.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            grid.iter()
                .map(|row| row.get(c).map_or(0, |cell| display_width(cell)))
                .max()
                .unwrap_or(0)
                .max(1)
        })
        .collect();
    let total = widths.iter().sum::<usize>() + 3 * columns.saturating_sub(1);
    if total > TABLE_MAX_WIDTH {
        return None;
    }
    let mut lines = Vec::with_capacity(grid.len() + 1);
    for (r, row) in grid.iter().enumerate() {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, cell)| {
                let alignment = alignments.get(c).copied().unwrap_or_default();
                pad(cell, widths[c], alignment)
            })
            .collect();
        lines.push(cells.join(" │ ").trim_end().to_string());
        if r == 0 {
            let rule: Vec<String> = widths.iter().map(|&w| "─".repeat(w)).collect();
            lines.push(rule.join("─┼─"));
        }
    }
    Some(lines.join("\n"))
}

fn pad(cell: &str, width: usize, alignment: Alignment) -> String {
    let gap = width.saturating_sub(display_width(cell));
    let (left, right) = match alignment {
        Alignment::Right => (gap, 0),
        Alignment::Center => (gap / 2, gap - gap / 2),
        Alignment::None | Alignment::Left => (0, gap),
    };
    format!("{}{cell}{}", " ".repeat(left), " ".repeat(right))
}

/// Monospace width by Unicode's East Asian Width and emoji presentation tables: combining
/// marks and zero-width characters 0, wide characters and emoji 2.
pub(crate) fn display_width(s: &str) -> usize {
    unicode_width::UnicodeWidthStr::width(s)
}
