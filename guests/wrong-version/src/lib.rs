//! A component built against another version of the Sluice world (`sluice:topology@0.9.0`).

wit_bindgen::generate!({
    inline: "
        package sluice:topology@0.9.0;
        interface processor {
            describe: func() -> string;
        }
        world topology {
            export processor;
        }
    ",
});

struct Old;

impl exports::sluice::topology::processor::Guest for Old {
    fn describe() -> String {
        "from another version".into()
    }
}

export!(Old);
