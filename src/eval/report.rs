//! A result table that prints on a terminal (comfy-table) and writes as CSV.

use anyhow::Context;
use std::path::Path;

pub struct Report {
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Report {
    pub fn new(headers: &[&str]) -> Self {
        Self { headers: headers.iter().map(|h| h.to_string()).collect(), rows: Vec::new() }
    }

    pub fn push(&mut self, row: Vec<String>) {
        debug_assert_eq!(row.len(), self.headers.len());
        self.rows.push(row);
    }

    pub fn table(&self) -> comfy_table::Table {
        let mut table = comfy_table::Table::new();
        table.load_preset(comfy_table::presets::UTF8_FULL_CONDENSED);
        table.set_header(&self.headers);
        for row in &self.rows {
            table.add_row(row);
        }
        // Numbers right-aligned, the first (label) column left.
        for column in table.column_iter_mut().skip(1) {
            column.set_cell_alignment(comfy_table::CellAlignment::Right);
        }
        table
    }

    pub fn write_csv(&self, path: &Path) -> anyhow::Result<()> {
        let mut writer = csv::Writer::from_path(path).with_context(|| format!("creating {}", path.display()))?;
        writer.write_record(&self.headers)?;
        for row in &self.rows {
            writer.write_record(row)?;
        }
        writer.flush().with_context(|| format!("writing {}", path.display()))?;
        Ok(())
    }
}
