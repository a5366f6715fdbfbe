"""
package.xml against our XML schema of package format 3 (REP 149), with lxml.

The official schema (download.ros.org/schema/package_format3.xsd) cannot be fetched in CI, so
``test/package_format3.xsd`` is ours; the negative cases below show that it rejects what
REP 149 forbids, and the positive ones that it accepts everything REP 149 allows.
"""

import copy
from pathlib import Path
import re

from lxml import etree
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCHEMA_PATH = Path(__file__).resolve().parent / 'package_format3.xsd'

# A manifest with every optional feature of REP 149, in the required group order.
FULL_MANIFEST = """<?xml version="1.0"?>
<package format="3">
  <name>my_package</name>
  <version compatibility="1.2">1.2.3</version>
  <description>Some <b>XHTML</b> text.</description>
  <maintainer email="someone@example.com">Someone</maintainer>
  <maintainer email="other.person+ros@sub.example.org">Other</maintainer>
  <license file="LICENSE" type="spdx">BSD-3-Clause</license>
  <license source-files="include/my_package/linear_math/*">Zlib</license>
  <url type="website">http://wiki.ros.org/my_package</url>
  <url type="repository">https://github.com/my_org/my_package</url>
  <url>https://github.com/my_org/my_package/issues</url>
  <author>John Doe</author>
  <author email="jane.doe@example.com">Jane Doe</author>
  <buildtool_depend>ament_cmake</buildtool_depend>
  <build_depend version_gte="1.1" version_lt="2.0">genmsg</build_depend>
  <depend condition="$ROS_VERSION == 2">rclcpp</depend>
  <depend condition="$ROS_VERSION == 1 or ($ROS_DISTRO != 'noetic')">roscpp</depend>
  <build_export_depend>libgstreamer0.10-dev</build_export_depend>
  <buildtool_export_depend>ament_cmake_python</buildtool_export_depend>
  <exec_depend version_eq="3">python3-numpy</exec_depend>
  <test_depend version_lte="1.2.3" version_gt="0">ament_lint_auto</test_depend>
  <doc_depend>doxygen</doc_depend>
  <conflict>alternative_implementation</conflict>
  <replace>my_old_package</replace>
  <exec_depend>libstdc++6</exec_depend>
  <group_depend>rosidl_interface_packages</group_depend>
  <member_of_group condition="$ROS_VERSION == 2">rosidl_runtime_packages</member_of_group>
  <export>
    <build_type condition="$ROS_VERSION == 2">ament_cmake</build_type>
    <architecture_independent/>
    <rviz plugin="${prefix}/plugin_description.xml"/>
  </export>
</package>
"""


@pytest.fixture(scope='module')
def schema():
    return etree.XMLSchema(etree.parse(str(SCHEMA_PATH)))


def _errors(schema, tree):
    ok = schema.validate(tree)
    return ok, '\n'.join(f'line {e.line}: {e.message}' for e in schema.error_log)


@pytest.mark.linter
def test_package_xml_is_valid_format3(schema):
    tree = etree.parse(str(ROOT / 'package.xml'))
    ok, errors = _errors(schema, tree)
    assert ok, f'package.xml does not validate against {SCHEMA_PATH.name}:\n{errors}'


@pytest.mark.linter
def test_package_xml_agrees_with_setup_py():
    tree = etree.parse(str(ROOT / 'package.xml'))
    setup_py = (ROOT / 'setup.py').read_text()
    version = re.search(r"version='([^']+)'", setup_py).group(1)
    package = re.search(r"PACKAGE = '([^']+)'", setup_py).group(1)
    assert tree.findtext('name').strip() == package
    assert tree.findtext('version').strip() == version
    assert tree.findtext('export/build_type').strip() == 'ament_python'


@pytest.mark.linter
def test_schema_accepts_every_rep149_feature(schema):
    ok, errors = _errors(schema, etree.fromstring(FULL_MANIFEST.encode()).getroottree())
    assert ok, errors


def _remove(path):
    def edit(root):
        node = root.find(path)
        node.getparent().remove(node)
    return edit


def _set(path, attr=None, text=None, delete_attr=None):
    def edit(root):
        node = root.find(path) if path else root
        if attr:
            node.set(*attr)
        if text is not None:
            node.text = text
        if delete_attr:
            del node.attrib[delete_attr]
    return edit


def _insert(index, xml):
    def edit(root):
        root.insert(index, etree.fromstring(xml))
    return edit


def _append(xml):
    def edit(root):
        root.append(etree.fromstring(xml))
    return edit


def _swap_maintainer_and_license(root):
    license_node = root.find('license')
    root.remove(license_node)
    root.find('maintainer').addprevious(license_node)


BROKEN = {
    'missing name': (_remove('name'), "Element 'version': This element is not expected"),
    'missing version': (_remove('version'), "Element 'description'"),
    'missing description': (_remove('description'), "Element 'maintainer'"),
    'missing maintainer': (_remove('maintainer'), "Element 'license'"),
    'missing license': (_remove('license'), 'Expected is .*license'),
    'maintainer without email': (_set('maintainer', delete_attr='email'),
                                 "The attribute 'email' is required"),
    'maintainer with bad email': (_set('maintainer', attr=('email', 'nobody@localhost')),
                                  "attribute 'email'.*not accepted by the pattern"),
    'unknown element': (_insert(5, '<homepage>https://example.com</homepage>'),
                        "Element 'homepage': This element is not expected"),
    'unknown element at end': (_append('<rosdep>x</rosdep>'),
                               "Element 'rosdep': This element is not expected"),
    'two-part version': (_set('version', text='0.1'), "'0.1' is not accepted by the pattern"),
    'leading zero version': (_set('version', text='01.2.3'),
                             "'01.2.3' is not accepted by the pattern"),
    'pre-release version': (_set('version', text='1.2.3-rc1'),
                            "'1.2.3-rc1' is not accepted by the pattern"),
    'dot-less version': (_set('version', text='1x2x3'), "'1x2x3' is not accepted"),
    'format 2': (_set('', attr=('format', '2')), "attribute 'format'.*fixed value constraint '3'"),
    'no format': (_set('', delete_attr='format'), "attribute 'format' is required"),
    'upper-case name': (_set('name', text='Oxygen_ros'), "'Oxygen_ros' is not accepted"),
    'double underscore name': (_set('name', text='oxygen__ros'), "'oxygen__ros' is not"),
    'license before maintainer': (_swap_maintainer_and_license,
                                  "Element 'license': This element is not expected"),
    'bad version limit': (_set('exec_depend', attr=('version_gte', '1.x')),
                          "attribute 'version_gte'.*'1.x' is not accepted"),
    'unknown dependency attribute': (_set('exec_depend', attr=('version_ge', '1')),
                                     "attribute 'version_ge' is not allowed"),
    'bad condition': (_set('exec_depend', attr=('condition', '$ROS_VERSION; rm')),
                      "attribute 'condition'.*not accepted by the pattern"),
    'empty dependency': (_set('exec_depend', text=' '),
                         "Element 'exec_depend'.*The value '' is not accepted"),
    'second export': (_append('<export/>'), "Element 'export': This element is not expected"),
    'dependency after export': (_append('<depend>rclpy</depend>'),
                                "Element 'depend': This element is not expected"),
    'bad url type': (_insert(5, '<url type="home">https://example.com</url>'),
                     "attribute 'type'.*'home' is not an element of the set"),
    'bad license type': (_set('license', attr=('type', 'osi')), "'osi' is not an element"),
}


@pytest.mark.linter
@pytest.mark.parametrize('case', sorted(BROKEN))
def test_schema_rejects_broken_package_xml(schema, case):
    edit, message = BROKEN[case]
    root = copy.deepcopy(etree.parse(str(ROOT / 'package.xml')).getroot())
    assert schema.validate(root.getroottree()), 'the unmodified package.xml must be valid'
    edit(root)
    ok, errors = _errors(schema, root.getroottree())
    assert not ok, f'{case}: accepted by the schema'
    assert re.search(message, errors), f'{case}: unexpected error(s):\n{errors}'
