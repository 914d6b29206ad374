"""`knittrans` is one PEP 420 namespace spread over several source roots.

setuptools cannot map one namespace to several `where` folders, so each subpackage is mapped to its own
folder here; everything else lives in pyproject.toml.
"""

from pathlib import Path

from setuptools import find_namespace_packages, setup

SOURCE_ROOTS = ("clients/python", "services/common", "services/admission", "services/reorg", "demo")

# The SDK root holds top-level modules (knittrans.types, knittrans.errors, ...), so it is mapped too.
packages: list[str] = ["knittrans"]
package_dir: dict[str, str] = {"knittrans": "clients/python/knittrans"}
for root in SOURCE_ROOTS:
    for package in find_namespace_packages(root, include=["knittrans.*"]):
        if not any((Path(root) / package.replace(".", "/")).glob("*.py")):
            continue
        packages.append(package)
        package_dir[package] = f"{root}/{package.replace('.', '/')}"

setup(packages=packages, package_dir=package_dir)
