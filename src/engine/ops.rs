//! Small MLX helpers shared by models and kernels.

use mlx_rs::{error::Result, Array, Dtype};

/// A 0-d array of `value` in `dtype` (so arithmetic keeps the other operand's dtype).
pub fn scalar(value: f32, dtype: Dtype) -> Result<Array> {
    Array::from_f32(value).as_dtype(dtype)
}

/// `[0, 1, ..., n-1]` as float32.
pub fn arange_f32(n: usize) -> Result<Array> {
    Array::arange::<f32, f32>(None, n as f32, None)
}

/// `[start, ..., start+n-1]` as int32.
pub fn arange_i32(start: usize, n: usize) -> Result<Array> {
    Array::arange::<i32, i32>(start as i32, (start + n) as i32, None)
}

/// Host copy of a float array (any float dtype), contiguous and in f32.
pub fn to_vec_f32(a: &Array) -> Result<Vec<f32>> {
    let a = a.as_dtype(Dtype::Float32)?;
    // A reshape to 1-D forces a contiguous copy when `a` is a strided view.
    let flat = a.reshape(&[-1])?;
    flat.eval()?;
    Ok(flat.as_slice::<f32>().to_vec())
}

/// Host copy of an integer array as i32.
pub fn to_vec_i32(a: &Array) -> Result<Vec<i32>> {
    let flat = a.as_dtype(Dtype::Int32)?.reshape(&[-1])?;
    flat.eval()?;
    Ok(flat.as_slice::<i32>().to_vec())
}

/// The raw little-endian bytes of any array, in row-major order.
pub fn to_bytes(a: &Array) -> Result<Vec<u8>> {
    let flat = a.reshape(&[-1])?.view::<u8>()?;
    flat.eval()?;
    Ok(flat.as_slice::<u8>().to_vec())
}
