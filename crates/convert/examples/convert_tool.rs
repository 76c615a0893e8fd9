//! A standalone driver of this crate with the same command syntax as `damascus quantize` and
//! `damascus synth` (handy for `tools/quant_compare.py` while the full CLI is being built):
//!
//! ```text
//! cargo run --release -p damascus-convert --example convert_tool -- quantize [--allow-requantize] [--threads N] IN OUT TYPE
//! cargo run --release -p damascus-convert --example convert_tool -- synth --shape NAME --tokenizer T [--type TYPE] [--seed N] [--threads N] OUT
//! ```

use std::path::PathBuf;
use std::time::Instant;

use damascus_convert::{
    DEFAULT_SEED, NoProgress, QuantizeOptions, Shape, SynthOptions, quantize_file, synth_model,
};
use damascus_quant::recipe::{Mix, RecipeOptions};

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut flag = |name: &str| -> Option<String> {
        let i = args.iter().position(|a| a == name)?;
        args.remove(i);
        if i < args.len() && name != "--allow-requantize" && name != "-q" {
            Some(args.remove(i))
        } else {
            Some(String::new())
        }
    };
    let allow = flag("--allow-requantize").is_some();
    let threads =
        flag("--threads").map_or(Ok(damascus_convert::default_threads()), |s| s.parse())?;
    let shape = flag("--shape");
    let tokenizer = flag("--tokenizer");
    let ftype = flag("--type").unwrap_or_else(|| "Q4_K_M".into());
    let seed = flag("--seed").map_or(Ok(DEFAULT_SEED), |s| s.parse())?;
    let _ = flag("-q");
    let mix_of = |s: &str| Mix::from_name(s).ok_or(format!("unknown type {s}"));
    let t0 = Instant::now();
    match args.as_slice() {
        [cmd, input, output, ty] if cmd == "quantize" => {
            let opts = QuantizeOptions {
                mix: mix_of(ty)?,
                allow_requantize: allow,
                threads,
                recipe: RecipeOptions::default(),
            };
            let s = quantize_file(input.as_ref(), output.as_ref(), &opts, &NoProgress)?;
            eprintln!("{s:?}\n{:.1} s", t0.elapsed().as_secs_f64());
        }
        [cmd, output] if cmd == "synth" => {
            let tok = PathBuf::from(tokenizer.ok_or("--tokenizer required")?);
            let opts = SynthOptions {
                shape: Shape::by_name(&shape.ok_or("--shape required")?)?,
                mix: mix_of(&ftype)?,
                seed,
                tokenizer: &tok,
                threads,
            };
            let s = synth_model(&opts, output.as_ref(), &NoProgress)?;
            eprintln!(
                "{} tensors, {} params, {} bytes, {:.1} s",
                s.n_tensors,
                s.n_params,
                s.file_size,
                t0.elapsed().as_secs_f64()
            );
        }
        _ => return Err("usage: quantize IN OUT TYPE | synth --shape S --tokenizer T OUT".into()),
    }
    Ok(())
}
