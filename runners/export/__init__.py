"""Export an architecture (a spec, or a sweep's chosen trial) as a transformers model directory."""
from .export import AUTO_MAP, Export, Scaled, config_dict, export_spec, export_trial, scale, write_dir
from .pick import PICKS, Choice, ExportError, choose
from .vendor import VendorError, vendor

__all__ = ["AUTO_MAP", "PICKS", "Choice", "Export", "ExportError", "Scaled", "VendorError",
           "choose", "config_dict", "export_spec", "export_trial", "scale", "vendor", "write_dir"]
