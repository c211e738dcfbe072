//! The benchmark page's figures, written as SVG: grouped bars (a bar per series in each
//! group) and lines over time, several panels to a file. SVG needs no fonts on the host:
//! the viewer draws the text, and plotters only estimates its size for the layout.

use std::error::Error;
use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// The first colours of the usual plotting palette, one per series.
const COLOURS: [RGBColor; 4] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
];
const FONT: &str = "sans-serif";
/// The size of axis labels, and the height of a line of them in pixels.
const LABEL: f64 = 11.0;
const LINE: f64 = 13.0;

pub type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// A limit drawn over the bars, in black.
pub enum Ceiling {
    None,
    /// One value for every group: a dashed line across the panel.
    Line(f64, String),
    /// A value per group (or none): a short solid line over each group.
    PerGroup(Vec<Option<f64>>, String),
}

/// One panel of grouped bars: `series` holds a value per group (0 draws no bar).
pub struct Bars {
    pub title: String,
    pub ylabel: String,
    pub groups: Vec<String>,
    pub series: Vec<(String, Vec<f64>)>,
    pub ceiling: Ceiling,
}

/// One panel of lines, x against y, with an optional dashed horizontal limit.
pub struct Lines {
    pub title: String,
    pub xlabel: String,
    pub series: Vec<(String, Vec<(f64, f64)>)>,
    pub limit: Option<(f64, String)>,
}

/// Writes `panels` to `path` in a `grid` of (rows, columns), the figure `size` pixels.
pub fn bar_figure(
    path: &Path,
    size: (u32, u32),
    grid: (usize, usize),
    panels: &[Bars],
) -> Result<()> {
    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE)?;
    for (area, panel) in root.split_evenly(grid).iter().zip(panels) {
        bar_panel(&root, area, panel)?;
    }
    root.present()?;
    Ok(())
}

/// Writes line `panels` to `path`, side by side.
pub fn line_figure(path: &Path, size: (u32, u32), panels: &[Lines]) -> Result<()> {
    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE)?;
    for (area, panel) in root.split_evenly((1, panels.len())).iter().zip(panels) {
        line_panel(area, panel)?;
    }
    root.present()?;
    Ok(())
}

/// The width plotters reserves for `text` at `size` points (its own estimate, which the
/// SVG viewer's font only roughly matches).
fn text_width(text: &str, size: f64) -> f64 {
    size / 1.24 / 1.24 * 0.7 * text.chars().count() as f64
}

fn bar_panel<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    area: &DrawingArea<DB, Shift>,
    p: &Bars,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let n = p.groups.len().max(1);
    let (width, height) = area.dim_in_pixel();
    // The names go under their groups, on as many lines as they need to fit beside each
    // other, or downwards where a word alone is too wide.
    let per_group = (width as f64 - 90.0) / n as f64 - 6.0;
    let wrapped: Vec<Vec<String>> = p.groups.iter().map(|g| wrap(g, per_group)).collect();
    let turned = wrapped
        .iter()
        .flatten()
        .any(|l| text_width(l, LABEL) > per_group);
    let label_area = if turned {
        p.groups
            .iter()
            .map(|g| text_width(g, LABEL))
            .fold(0.0, f64::max)
            + 12.0
    } else {
        wrapped.iter().map(Vec::len).max().unwrap_or(1) as f64 * LINE + 10.0
    };

    let ceilings: Vec<f64> = match &p.ceiling {
        Ceiling::None => vec![],
        Ceiling::Line(v, _) => vec![*v],
        Ceiling::PerGroup(v, _) => v.iter().flatten().copied().collect(),
    };
    let values = p.series.iter().flat_map(|(_, v)| v.iter()).chain(&ceilings);
    let entries = p.series.len() + usize::from(!ceilings.is_empty());
    let plot_height = height as f64 - label_area - 45.0;
    let top = with_headroom(values.copied().fold(0.0, f64::max), entries, plot_height);

    let mut chart = ChartBuilder::on(area)
        .caption(&p.title, (FONT, 13))
        .margin(8)
        .x_label_area_size(label_area as u32)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5..(n as f64 - 0.5), 0.0..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .light_line_style(TRANSPARENT)
        .y_label_formatter(&tick)
        .y_desc(p.ylabel.as_str())
        .label_style((FONT, LABEL))
        .draw()?;

    let w = 0.8 / p.series.len().max(1) as f64;
    for (i, (name, values)) in p.series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let shift = (i as f64 - (p.series.len() as f64 - 1.0) / 2.0) * w;
        let bars = values
            .iter()
            .enumerate()
            .filter(|(_, v)| **v > 0.0)
            .map(|(g, v)| {
                let x = g as f64 + shift;
                Rectangle::new([(x - w / 2.0, 0.0), (x + w / 2.0, *v)], colour.filled())
            });
        chart
            .draw_series(bars)?
            .label(name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
    }
    match &p.ceiling {
        Ceiling::None => {}
        Ceiling::Line(v, label) => {
            let line = [(-0.5, *v), (n as f64 - 0.5, *v)];
            chart
                .draw_series(DashedLineSeries::new(line, 6, 4, BLACK.stroke_width(1)))?
                .label(label.as_str())
                .legend(|(x, y)| PathElement::new([(x, y), (x + 12, y)], BLACK));
        }
        Ceiling::PerGroup(values, label) => {
            let lines = values.iter().enumerate().filter_map(|(g, v)| {
                let (g, v) = (g as f64, (*v)?);
                Some(PathElement::new(
                    [(g - 0.45, v), (g + 0.45, v)],
                    BLACK.stroke_width(2),
                ))
            });
            chart
                .draw_series(lines)?
                .label(label.as_str())
                .legend(|(x, y)| PathElement::new([(x, y), (x + 12, y)], BLACK.stroke_width(2)));
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK.mix(0.3))
        .label_font((FONT, 10))
        .draw()?;

    // The group names, drawn on the whole figure at the bars' own pixel positions.
    let style = TextStyle::from((FONT, LABEL).into_font());
    for (g, lines) in wrapped.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(g as f64, 0.0));
        if turned {
            let style = style
                .transform(FontTransform::Rotate90)
                .pos(Pos::new(HPos::Left, VPos::Center));
            root.draw(&Text::new(p.groups[g].as_str(), (x, y + 6), style))?;
            continue;
        }
        let style = style.pos(Pos::new(HPos::Center, VPos::Top));
        for (i, line) in lines.iter().enumerate() {
            let y = y + 6 + (i as f64 * LINE) as i32;
            root.draw(&Text::new(line.as_str(), (x, y), style.clone()))?;
        }
    }
    Ok(())
}

/// `text` in lines no wider than `width` where its words allow.
fn wrap(text: &str, width: f64) -> Vec<String> {
    let mut lines: Vec<String> = vec![];
    for word in text.split_whitespace() {
        match lines.last_mut() {
            Some(l) if text_width(&format!("{l} {word}"), LABEL) <= width => {
                l.push(' ');
                l.push_str(word);
            }
            _ => lines.push(word.to_string()),
        }
    }
    lines
}

/// The top of the y axis: room above the highest value for a legend of `entries` lines in
/// the upper corner, so that it covers no data.
fn with_headroom(highest: f64, entries: usize, plot_height: f64) -> f64 {
    if highest <= 0.0 {
        return 1.0;
    }
    let legend = (entries as f64 * 16.0 + 20.0) / plot_height.max(1.0);
    highest / (1.0 - legend.min(0.6))
}

/// An axis figure without trailing zeros: 10000, 0.2, 2.5.
fn tick(v: &f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn line_panel<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, p: &Lines) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let points = || p.series.iter().flat_map(|(_, s)| s.iter());
    let right = points().map(|(x, _)| *x).fold(0.0, f64::max).max(1.0);
    let highest = points()
        .map(|(_, y)| *y)
        .chain(p.limit.iter().map(|(v, _)| *v))
        .fold(0.0, f64::max);
    let entries = p.series.len() + usize::from(p.limit.is_some());
    let top = with_headroom(highest, entries, area.dim_in_pixel().1 as f64 - 80.0);
    let mut chart = ChartBuilder::on(area)
        .caption(&p.title, (FONT, 13))
        .margin(8)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..right, 0.0..top)?;
    chart
        .configure_mesh()
        .light_line_style(TRANSPARENT)
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .x_desc(p.xlabel.as_str())
        .label_style((FONT, LABEL))
        .draw()?;
    for (i, (name, s)) in p.series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(s.iter().copied(), colour.stroke_width(2)))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 12, y)], colour.stroke_width(2)));
    }
    if let Some((v, label)) = &p.limit {
        chart
            .draw_series(DashedLineSeries::new(
                [(0.0, *v), (right, *v)],
                6,
                4,
                BLACK.stroke_width(1),
            ))?
            .label(label.as_str())
            .legend(|(x, y)| PathElement::new([(x, y), (x + 12, y)], BLACK));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK.mix(0.3))
        .label_font((FONT, 10))
        .draw()?;
    Ok(())
}
